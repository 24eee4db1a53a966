"""Progress wherever work is long, and the way to start a job: MXNet's --disp-batches in
the image-classification example, a worker waiting for its scheduler says so every 10 s,
the no-launcher error gives the command that works (and it does), and the timelines of
a job's processes merge into one trace with a lane per node."""
import json
import os
import re
import socket
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
BUILD = os.path.abspath(os.environ.get('PSKV_BUILD_DIR', os.path.join(ROOT, 'build')))
LAUNCH = os.path.join(BUILD, 'pskv-launch')
EXAMPLE = os.path.join(ROOT, 'examples', 'image_classification.py')


def env(**extra):
    e = dict(os.environ, PYTHONPATH=os.path.join(BUILD, 'python'))
    for k in ('DMLC_ROLE', 'DMLC_PS_ROOT_URI', 'DMLC_PS_ROOT_PORT', 'DMLC_NUM_WORKER', 'DMLC_NUM_SERVER',
              'PSKV_TIMELINE'):
        e.pop(k, None)
    e.update(extra)
    return e


def run(cmd, timeout=180, **kw):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, **kw)
    return p.returncode, p.stdout.decode(errors='replace')


def test_disp_batches_prints_speedometer_lines_and_evaluation_progress():
    pytest.importorskip('torchvision')
    args = ['/usr/bin/python3', EXAMPLE, '--kvstore', 'local', '--synthetic', '--width', '0.125',
            '--train-samples', '256', '--test-samples', '100', '--batch-size', '32', '--max-batches', '4',
            '--threads', '1']
    rc, out = run(args + ['--disp-batches', '2'], env=env())
    assert rc == 0, out
    lines = re.findall(r'^Epoch\[0\] Batch \[(\d+)-(\d+)/(\d+)\]\tSpeed: ([\d.]+) samples/sec\t'
                       r'loss=([\d.]+)\taccuracy=([\d.]+)\t\d+ s left in the epoch$', out, re.M)
    assert [l[:3] for l in lines] == [('0', '2', '4'), ('2', '4', '4')], out
    assert all(float(l[3]) > 0 and 0 <= float(l[5]) <= 1 for l in lines), lines
    assert 'Epoch[0] evaluating on 100 test images' in out, out
    assert re.search(r'^Epoch\[0\] Validation-accuracy=[\d.]+ \(100 images, [\d.]+ s\)$', out, re.M), out
    rc, out = run(args + ['--disp-batches', '0'], env=env())
    assert rc == 0 and 'Batch [' not in out, out
    rc, out = run(args + ['--disp-batches', '-1'], env=env())
    assert rc == 2 and '--disp-batches must be 0' in out, out


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def test_a_worker_without_its_scheduler_says_it_is_waiting():
    port = free_port()   # nothing listens there
    e = env(DMLC_ROLE='worker', DMLC_PS_ROOT_URI='127.0.0.1', DMLC_PS_ROOT_PORT=str(port), DMLC_NUM_WORKER='1',
            DMLC_NUM_SERVER='1', PSKV_REGISTER_TIMEOUT='12')
    rc, out = run(['/usr/bin/python3', '-c', 'import pskv; pskv.create("dist_sync")'], env=e, timeout=60)
    assert rc != 0, out
    line = 'waiting for the scheduler at 127.0.0.1:%d (10 s of 12 s, PSKV_REGISTER_TIMEOUT)' % port
    assert out.count(line) == 1, out
    assert out.index(line) < out.index('not reachable after 12 s'), out


def test_without_a_launcher_the_error_gives_the_command_that_works(tmp_path):
    script = tmp_path / 'job.py'
    script.write_text('import sys, numpy as np, pskv\n'
                      'kv = pskv.create("dist_sync")\n'
                      'kv.init(0, np.zeros(2, np.float32)); kv.push(0, np.ones(2, np.float32))\n'
                      'o = np.zeros(2, np.float32); kv.pull(0, out=o)\n'
                      'print("rank", kv.rank, "of", kv.num_workers, "args", sys.argv[1:], "sum", o[0])\n')
    rc, out = run(['/usr/bin/python3', str(script), '--lr', '0.1'], env=env(), cwd=str(tmp_path))
    assert rc != 0 and 'ConfigError' in out, out
    m = re.search(r'2 workers and 1 server on this machine: (.*)$', out, re.M)
    assert m, out
    cmd = m.group(1)
    assert cmd == 'PYTHONPATH=%s %s -n 2 -s 1 -- /usr/bin/python3 %s --lr 0.1' % (
        os.path.join(BUILD, 'python'), LAUNCH, script), cmd
    # Pasted into a shell, it runs the job.
    e = env()
    e.pop('PYTHONPATH')
    rc, out = run(['/bin/bash', '-c', cmd], env=e, cwd=str(tmp_path))
    assert rc == 0, out
    assert "rank 0 of 2 args ['--lr', '0.1'] sum 2.0" in out and "rank 1 of 2 args ['--lr', '0.1'] sum 2.0" in out, out


def test_timelines_of_a_job_merge_into_one_trace_with_a_lane_per_node(tmp_path):
    script = tmp_path / 'w.py'
    script.write_text('import numpy as np, pskv\nkv = pskv.create("dist_sync")\n'
                      'kv.init(["a", "b"], [np.zeros(1000, np.float32), np.zeros(10, np.float32)])\n'
                      'for _ in range(3):\n'
                      '    kv.pushpull(["a", "b"], [np.ones(1000, np.float32), np.ones(10, np.float32)])\n')
    trace = tmp_path / 'tl' / 'trace.json'
    trace.parent.mkdir()
    rc, out = run([LAUNCH, '-n', '2', '-s', '1', '--timeout', '90', '--env', 'PSKV_TIMELINE=%s' % trace, '--',
                   '/usr/bin/python3', str(script)], env=env(), cwd=str(tmp_path))
    assert rc == 0, out
    files = sorted(os.listdir(trace.parent))
    # the scheduler and its standby (pskv-launch starts one by default), a server, 2 workers
    assert len(files) == 5 and all(re.match(r'trace\.(scheduler|server|worker)\.\d+\.json$', f) for f in files), files
    merged = tmp_path / 'job.json'
    rc, out = run(['/usr/bin/python3', '-m', 'pskv.timeline', 'merge', str(trace), '-o', str(merged)], env=env())
    assert rc == 0, out
    assert '5 processes (' in out, out
    events = json.load(open(merged))['traceEvents']
    names = {e['pid']: e['args']['name'] for e in events if e.get('name') == 'process_name'}
    lanes = [names[p].split(' (pid')[0] for p in sorted(names)]
    # the two schedulers first (in the order they started), then by role and rank
    assert sorted(lanes[:2]) == ['scheduler', 'standby scheduler'], lanes
    assert lanes[2:] == ['server[0]', 'worker[0]', 'worker[1]'], lanes
    spans = [e for e in events if e.get('ph') == 'X']
    for lane in sorted(names)[2:]:     # the server and both workers recorded their operations
        assert any(e['pid'] == lane for e in spans), (names[lane], len(spans))
    assert any(e['name'] == 'pushpull' for e in spans if e['pid'] == 4), [e for e in spans if e['pid'] == 4][:5]
    # The directory works as well, and a file cut short (a killed process) is read up to
    # its last whole event.
    worker = [f for f in files if '.worker.' in f][0]
    text = open(trace.parent / worker).read()
    cut = text[:text.rindex('{"name"') + 20]
    (trace.parent / worker).write_text(cut)
    rc, out = run(['/usr/bin/python3', '-m', 'pskv.timeline', 'merge', str(trace.parent), '-o', str(merged)],
                  env=env())
    assert rc == 0 and '5 processes' in out, out
    rc, out = run(['/usr/bin/python3', '-m', 'pskv.timeline', 'merge', str(tmp_path / 'nothing'), '-o',
                   str(merged)], env=env())
    assert rc == 1 and 'no PSKV_TIMELINE files' in out, out
