#!/usr/bin/python3
"""bench/train: training throughput (samples/s) of LeNet on Fashion-MNIST for
  * 1 process (pskv.torch, local store),
  * 2 workers + 1 server under pskv-launch, dist_sync and dist_async (pskv.torch),
  * 2 processes of PyTorch DistributedDataParallel (gloo) — the ceiling,
all with the same model, data partitioning, batch size per worker and step count,
measured in the same run. Prints a table and, with --json, one JSON object per line;
`ratio` is samples/s over DDP's.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, '..', '..')
BUILD = os.environ.get('PSKV_BUILD_DIR', os.path.join(ROOT, 'build'))
EXAMPLE = os.path.join(ROOT, 'examples', 'train_fmnist.py')


def free_port():
    s = socket.socket()
    s.bind(('127.0.0.1', 0))
    p = s.getsockname()[1]
    s.close()
    return p


def last_metrics(path):
    with open(path) as f:
        return json.loads(f.read().strip().splitlines()[-1])


def run(cmd, env):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1800)
    if p.returncode != 0:
        sys.stderr.write(p.stdout.decode())
        raise SystemExit('benchmark run failed: %s' % ' '.join(cmd))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--json', action='store_true')
    ap.add_argument('--network', default='lenet')
    ap.add_argument('--max-batches', type=int, default=150, help='steps per run (per worker)')
    ap.add_argument('--batch-size', type=int, default=64)
    ap.add_argument('--plot', metavar='DIR', help='also write DIR/train.png (bench/plot.py, python3-matplotlib)')
    a = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, 'python'))
    # Every run gets the same BLAS threading pskv-launch gives its workers: each of
    # the 2 processes its share of the cores (an OpenBLAS thread per core in each
    # process would oversubscribe them and slow DDP down unfairly); 1 process: all.
    cores = os.cpu_count() or 1
    env_pair = dict(env, OPENBLAS_NUM_THREADS=str(max(1, cores // 2)))
    env_one = dict(env, OPENBLAS_NUM_THREADS=str(cores))
    common = ['--network', a.network, '--epochs', '1', '--max-batches', str(a.max_batches),
              '--batch-size', str(a.batch_size)]
    results = []
    with tempfile.TemporaryDirectory() as d:
        m = os.path.join(d, 'ddp')
        port = free_port()
        procs = [subprocess.Popen(['/usr/bin/python3', os.path.join(HERE, 'ddp_fmnist.py'), '--world-size', '2',
                                   '--rank', str(r), '--port', str(port), '--metrics-out', m, '--network', a.network,
                                   '--max-batches', str(a.max_batches), '--batch-size', str(a.batch_size)],
                                  env=env_pair, stdout=subprocess.DEVNULL)
                 for r in range(2)]
        if any(p.wait(timeout=1800) != 0 for p in procs):
            raise SystemExit('DDP baseline failed')
        ddp = last_metrics(m)
        runs = [('pskv 1 process (local)', ['/usr/bin/python3', EXAMPLE, '--kv-store', 'local'] + common),
                ('pskv 2 workers dist_sync', [os.path.join(BUILD, 'pskv-launch'), '-n', '2', '-s', '1', '--',
                                              '/usr/bin/python3', EXAMPLE, '--kv-store', 'dist_sync'] + common),
                ('pskv 2 workers dist_async', [os.path.join(BUILD, 'pskv-launch'), '-n', '2', '-s', '1', '--',
                                               '/usr/bin/python3', EXAMPLE, '--kv-store', 'dist_async'] + common)]
        for name, cmd in runs:
            path = os.path.join(d, name.replace(' ', '_'))
            run(cmd + ['--metrics-out', path], env_one if '1 process' in name else env_pair)
            results.append((name, last_metrics(path)))
        results.append(('torch DDP gloo 2 workers', ddp))
    ceiling = ddp['samples_per_sec']
    records = []
    if not a.json:
        print('bench/train: %s on Fashion-MNIST, batch %d per worker, %d steps; ceiling = PyTorch DDP (gloo)'
              % (a.network, a.batch_size, a.max_batches))
        print('%-28s %12s %10s %10s' % ('run', 'samples/s', 'accuracy', 'ratio'))
    for name, r in results:
        rec = {'bench': 'train', 'run': name, 'samples_per_sec': round(r['samples_per_sec'], 1),
               'test_accuracy': round(r['test_accuracy'], 4), 'ceiling_samples_per_sec': round(ceiling, 1),
               'ratio': round(r['samples_per_sec'] / ceiling, 3)}
        records.append(rec)
        if a.json:
            print(json.dumps(rec))
        else:
            print('%-28s %12.1f %10.4f %10.3f' % (name, rec['samples_per_sec'], rec['test_accuracy'], rec['ratio']))

    if a.plot:
        sys.path.insert(0, os.path.join(HERE, '..'))
        import plot
        with tempfile.NamedTemporaryFile('w', suffix='.json', delete=False) as f:
            f.write(''.join(json.dumps(r) + '\n' for r in records))
        try:
            plot.main(['--out', a.plot, f.name])
        finally:
            os.unlink(f.name)


if __name__ == '__main__':
    main()
