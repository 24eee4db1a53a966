"""Timeline and metrics of a real job (pskv-launch, 2 workers, 1 server):
PSKV_TIMELINE writes one Chrome trace per process, loaded here as JSON and checked
event by event; PSKV_METRICS_PORT serves Prometheus text, scraped during a running
job and parsed; PSKV_METRICS_FILE is the same text dumped at exit."""
import glob
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request

BUILD = os.path.abspath(os.environ.get('PSKV_BUILD_DIR', os.path.join(os.path.dirname(__file__), '..', '..', 'build')))
LAUNCH = os.path.join(BUILD, 'pskv-launch')
WORKER = os.path.join(BUILD, 'tests', 'dist_worker')
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')


def parse_prometheus(text):
    """[(name, {label: value}, float)] of a Prometheus text exposition; checks TYPE lines."""
    samples, types = [], {}
    for line in text.splitlines():
        if line.startswith('# TYPE '):
            _, _, name, kind = line.split()
            types[name] = kind
            continue
        if not line or line.startswith('#'):
            continue
        m = SAMPLE.match(line)
        assert m, 'not a Prometheus sample: %r' % line
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ''))
        samples.append((m.group(1), labels, float(m.group(4))))
    for name, _, _ in samples:
        base = re.sub(r'_(bucket|sum|count)$', '', name)
        assert name in types or base in types, 'no TYPE for ' + name
    return samples


def env():
    e = dict(os.environ, DMLC_PS_ROOT_URI='127.0.0.1')
    return e


def test_timeline_is_a_chrome_trace_of_every_operation(tmp_path):
    p = subprocess.run([LAUNCH, '-n', '2', '-s', '1', '--timeout', '60', '--env',
                        'PSKV_TIMELINE=%s' % (tmp_path / 'trace.json'), '--env',
                        'PSKV_METRICS_FILE=%s' % (tmp_path / 'metrics.prom'), '--', WORKER, 'sync', '2'],
                       env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=90)
    out = p.stdout.decode()
    assert p.returncode == 0, out
    workers = sorted(glob.glob(str(tmp_path / 'trace.worker.*.json')))
    servers = glob.glob(str(tmp_path / 'trace.server.*.json'))
    assert len(workers) == 2 and len(servers) == 1, os.listdir(tmp_path)
    # the scheduler's timeline: its barriers (after start-up, after init, the final one);
    # its standby (pskv-launch starts one by default) writes one too, and releases none
    sched = glob.glob(str(tmp_path / 'trace.scheduler.*.json'))
    assert len(sched) == 2, os.listdir(tmp_path)
    released = [[e for e in json.load(open(f)) if e['ph'] == 'X' and e['cat'] == 'barrier'] for f in sched]
    assert sorted(len(b) > 0 for b in released) == [False, True], released
    barriers = max(released, key=len)
    groups = {e['args']['key'] for e in barriers}
    assert {'workers', 'all nodes'} <= groups, groups
    assert all(e['dur'] >= 0 for e in barriers)
    worker_keys = set()
    for path in workers + servers:
        events = json.load(open(path))  # complete JSON: closed at exit
        meta = [e for e in events if e['ph'] == 'M']
        assert meta and meta[0]['name'] == 'process_name'
        slices = [e for e in events if e['ph'] == 'X']
        assert slices, path
        for e in slices:
            assert isinstance(e['ts'], int) and isinstance(e['dur'], int) and e['dur'] >= 0
            assert e['pid'] == meta[0]['pid'] and e['tid'] == e['cat']
            assert 'key' in e['args'] and e['args']['bytes'] >= 0
        lanes = {(e['name'], e['cat']) for e in slices}
        if path in workers:
            for op in ('push', 'pull', 'pushpull'):
                assert (op, 'issue') in lanes and (op, 'network') in lanes, (op, lanes)
            # every operation has its issue slice before its network slice
            by = {}
            for e in slices:
                by.setdefault((e['name'], e['args']['key']), []).append(e)
            for (op, key), es in by.items():
                issue = sorted(x['ts'] for x in es if x['cat'] == 'issue')
                net = sorted(x['ts'] for x in es if x['cat'] == 'network')
                assert len(issue) == len(net) and all(i <= n for i, n in zip(issue, net)), (op, key)
            worker_keys |= {e['args']['key'] for e in slices}
        else:
            assert {('merge', 'merge'), ('update', 'update'), ('reply', 'reply')} <= lanes, lanes
            server_keys = {e['args']['key'] for e in slices if e['cat'] == 'merge'}
    assert server_keys and server_keys <= worker_keys, (server_keys, worker_keys)
    # metrics dumped at exit, one file per process
    dumps = glob.glob(str(tmp_path / 'metrics.worker.*.prom'))
    assert len(dumps) == 2
    samples = parse_prometheus(open(dumps[0]).read())
    pushes = [v for n, l, v in samples if n == 'pskv_ops_total' and l['op'] == 'push']
    assert pushes and sum(pushes) > 0


def check_peer_histogram(metrics, peer):
    """pskv_peer_ops_total > 0 and a consistent pskv_peer_latency_seconds histogram."""
    ops = [v for n, l, v in metrics if n == 'pskv_peer_ops_total' and l['peer'] == peer]
    assert ops and ops[0] > 0, metrics
    b = [(l['le'], v) for n, l, v in metrics if n == 'pskv_peer_latency_seconds_bucket' and l['peer'] == peer]
    vals = [v for _, v in b]
    assert vals == sorted(vals) and b[-1][0] == '+Inf', b
    count = [v for n, l, v in metrics if n == 'pskv_peer_latency_seconds_count' and l['peer'] == peer]
    assert count == [vals[-1]] == ops, (count, ops)  # every request is in the histogram
    total = [v for n, l, v in metrics if n == 'pskv_peer_latency_seconds_sum' and l['peer'] == peer]
    assert total and total[0] >= 0


def test_metrics_endpoint_during_a_job(tmp_path):
    s = socket.socket()
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
    s.close()
    markers = tmp_path / 'markers'
    markers.mkdir()
    log = open(tmp_path / 'out', 'wb')
    proc = subprocess.Popen([LAUNCH, '-n', '2', '-s', '1', '--timeout', '60', '--env', 'PSKV_METRICS_PORT=%d' % port,
                             '--env', 'PSKV_TEST_MARKER_DIR=%s' % markers, '--', WORKER, 'loop_until_failure'],
                            env=env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        urls = {}
        end = time.time() + 30
        while time.time() < end and (len(urls) < 3 or len(os.listdir(markers)) < 2):
            for m in re.finditer(r'\[(worker \d|server 0)\] INFO: metrics: http://127\.0\.0\.1:(\d+)/metrics',
                                 (tmp_path / 'out').read_text()):
                urls[m.group(1)] = 'http://127.0.0.1:%s/metrics' % m.group(2)
            time.sleep(0.1)
        assert len(urls) == 3, (tmp_path / 'out').read_text()
        assert len(set(urls.values())) == 3  # one port per process, from the same setting
        time.sleep(0.5)  # let the workers push for a while
        got = {}
        for name, url in urls.items():
            with urllib.request.urlopen(url, timeout=10) as r:
                assert r.headers['Content-Type'].startswith('text/plain')
                got[name] = parse_prometheus(r.read().decode())
        for w in ('worker 0', 'worker 1'):
            ops = {(l['op'], l['key']): v for n, l, v in got[w] if n == 'pskv_ops_total'}
            assert ops.get(('push', '3'), 0) > 0 and ops.get(('pull', '3'), 0) > 0, ops
            node = {l['node'] for n, l, v in got[w]}
            assert node == {'worker[%s]' % w[-1]}, node
            # the latency histogram: cumulative buckets, +Inf == count
            b = [(l['le'], v) for n, l, v in got[w] if n == 'pskv_op_latency_seconds_bucket'
                 and l['op'] == 'push' and l['key'] == '3']
            vals = [v for _, v in b]
            assert vals == sorted(vals) and b[-1][0] == '+Inf'
            count = [v for n, l, v in got[w] if n == 'pskv_op_latency_seconds_count' and l['op'] == 'push'
                     and l['key'] == '3']
            assert count == [vals[-1]]
            # per-peer counters on the workers: bytes both ways, requests, latency histogram
            peers = {(l['peer'], l['direction']): v for n, l, v in got[w] if n == 'pskv_peer_bytes_total'}
            assert peers.get(('server[0]', 'out'), 0) > 0 and peers.get(('server[0]', 'in'), 0) > 0, peers
            check_peer_histogram(got[w], 'server[0]')
        server = got['server 0']
        peers = {(l['peer'], l['direction']): v for n, l, v in server if n == 'pskv_peer_bytes_total'}
        assert peers.get(('worker[0]', 'in'), 0) > 0 and peers.get(('worker[1]', 'out'), 0) > 0, peers
        for w in ('worker[0]', 'worker[1]'):
            check_peer_histogram(server, w)
        merges = [v for n, l, v in server if n == 'pskv_ops_total' and l['op'] == 'merge']
        assert merges and sum(merges) > 0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        log.close()
