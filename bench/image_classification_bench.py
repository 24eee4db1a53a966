#!/usr/bin/python3
"""image_classification_bench.py: pskv against PyTorch DDP (gloo) on the seeds' models.

examples/image_classification.py on the Fashion-MNIST stand-in (3x32x32), the same
model, data, batches and start for both:

  * pskv:     pskv-launch -n N -s S, --kvstore dist_sync (pskv.torch.Trainer, SGD on
              the servers, gradients pushed from backward hooks);
  * ddp-gloo: the same launch with --ddp (DistributedDataParallel over gloo; the
              ranks' rendezvous goes through the pskv job, then gloo alone moves data).

for VGG-11 (MXNet Gluon's shape at 32x32: 28.1 M parameters, 113 MB of gradients a
step; the results in bench/results/ before issue 38 are vgg11_linear's 9.2 M, 37 MB)
and ResNet-18 (11.2 M, 45 MB but ~0.56 GFLOP a sample: compute-heavy). The two modes alternate
run by run (--rounds each, same machine state); reported: the median of
steady_samples_per_sec (all workers, without the first 2 batches) per model and mode,
and pskv / ddp, as JSON lines (one per model) in --out.

On loopback (default) every process shares this machine's cores and memory; with
--cluster (root, iproute2, sshd: tests/cluster/netns_cluster.py) the job runs over
ssh across network namespaces, one host per process, joined by a --rate limited link
(the CPU is still this machine's).

    /usr/bin/python3 bench/image_classification_bench.py [--models vgg11,resnet18]
        [--workers 2] [--servers 1] [--batches 12] [--batch-size 32] [--rounds 2]
        [--width 1] [--cluster --rate 1gbit] [--out bench/results/image_classification.json]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLE = os.path.join(ROOT, 'examples', 'image_classification.py')
BUILD = os.path.abspath(os.environ.get('PSKV_BUILD_DIR', os.path.join(ROOT, 'build')))
MODES = ('pskv', 'ddp-gloo')


def example_args(args, model, mode):
    a = ['/usr/bin/python3', EXAMPLE, '--dataset', 'fashion-mnist', '--model', model, '--width', str(args.width),
         '--batch-size', str(args.batch_size), '--max-batches', str(args.batches), '--epochs', '1',
         '--test-samples', '100', '--threads', str(args.threads), '--json']
    return a + (['--ddp'] if mode == 'ddp-gloo' else ['--kvstore', 'dist_sync'])


def run_job(args, model, mode, cluster=None):
    """One job; returns the example's JSON record (raises with the output on failure)."""
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, 'python'))
    for k in ('DMLC_ROLE', 'DMLC_PS_ROOT_URI', 'DMLC_INTERFACE', 'DMLC_NODE_HOST'):
        env.pop(k, None)
    launch = [os.path.join(BUILD, 'pskv-launch'), '-n', str(args.workers), '-s', str(args.servers),
              '--timeout', str(args.timeout), '--env', 'PYTHONPATH=' + env['PYTHONPATH']]
    if cluster is None:
        cmd = launch + ['--'] + example_args(args, model, mode)
    else:
        # one host per server and worker, the launcher (and scheduler) on host 0
        hosts = cluster.hosts[:args.workers + args.servers]
        cmd = cluster.hosts[0].argv(launch + ['-H', cluster.hostfile(hosts)] + cluster.launcher_ssh_args() +
                                    ['--'] + example_args(args, model, mode))
    p = subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=args.timeout + 60)
    recs = [json.loads(l[l.index('{'):]) for l in p.stdout.splitlines() if '{"epoch"' in l]
    if p.returncode != 0 or len(recs) != 1:
        raise RuntimeError('%s %s failed (exit %d):\n%s' % (model, mode, p.returncode, p.stdout[-4000:]))
    return recs[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--models', default='vgg11,resnet18')
    ap.add_argument('--workers', type=int, default=2)
    ap.add_argument('--servers', type=int, default=1)
    ap.add_argument('--batches', type=int, default=12, help='batches per run (2 of them warm-up)')
    ap.add_argument('--batch-size', type=int, default=32, help='per worker')
    ap.add_argument('--width', type=float, default=1.0)
    ap.add_argument('--threads', type=int, default=1, help='torch threads per worker')
    ap.add_argument('--rounds', type=int, default=2)
    ap.add_argument('--timeout', type=int, default=300)
    ap.add_argument('--cluster', action='store_true', help='across network-namespace hosts (root)')
    ap.add_argument('--rate', default='1gbit', help='--cluster: link rate per host (tc tbf)')
    ap.add_argument('--out', default=os.path.join(HERE, 'results', 'image_classification.json'))
    args = ap.parse_args()
    if args.batches < 3:
        ap.error('--batches must be at least 3 (2 are warm-up)')
    models = [m for m in args.models.split(',') if m]
    load_before = os.getloadavg()

    cluster = None
    if args.cluster:
        sys.path.insert(0, os.path.join(ROOT, 'tests', 'cluster'))
        import netns_cluster
        reason = netns_cluster.why_unavailable()
        if reason:
            sys.exit('image_classification_bench.py: --cluster unavailable: ' + reason)
        cluster = netns_cluster.Cluster(hosts=args.workers + args.servers, networks={'net': args.rate})
    try:
        runs = {(m, mode): [] for m in models for mode in MODES}
        for r in range(args.rounds):
            for m in models:
                for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                    rec = run_job(args, m, mode, cluster)
                    runs[(m, mode)].append(rec)
                    print('round %d %-9s %-8s %7.1f samples/s (steady), loss %.3f -> %.3f' % (
                        r + 1, m, mode, rec['steady_samples_per_sec'], rec['first_loss'], rec['train_loss']),
                        flush=True)
    finally:
        if cluster is not None:
            cluster.close()

    rows = []
    for m in models:
        med = {mode: statistics.median(x['steady_samples_per_sec'] for x in runs[(m, mode)]) for mode in MODES}
        rec = runs[(m, 'pskv')][0]
        rows.append({'model': m, 'parameters': rec['parameters'], 'gradient_mb': rec['parameters'] * 4 / 1e6,
                     'pskv_samples_per_sec': med['pskv'], 'ddp_gloo_samples_per_sec': med['ddp-gloo'],
                     'pskv_over_ddp': med['pskv'] / med['ddp-gloo'],
                     'runs': {mode: [x['steady_samples_per_sec'] for x in runs[(m, mode)]] for mode in MODES}})
    print('\n| model | parameters | pskv samples/s | DDP-gloo samples/s | pskv / DDP |')
    print('|---|---|---|---|---|')
    for r in rows:
        print('| %s | %.1f M | %.1f | %.1f | %.2f |' % (r['model'], r['parameters'] / 1e6, r['pskv_samples_per_sec'],
                                                     r['ddp_gloo_samples_per_sec'], r['pskv_over_ddp']))
    common = {'bench': 'image_classification', 'time': time.strftime('%Y-%m-%dT%H:%M:%S'),
              'machine': {'cpus': os.cpu_count(), 'platform': platform.platform(),
                          'load_before': load_before},
              'setup': {'workers': args.workers, 'servers': args.servers, 'batch_size': args.batch_size,
                        'batches': args.batches, 'warmup_batches': 2, 'width': args.width,
                        'threads_per_worker': args.threads, 'rounds': args.rounds, 'data': 'fashion-mnist 3x32x32',
                        'network': ('netns hosts, %s links' % args.rate) if args.cluster else 'loopback'}}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, 'w') as f:        # JSON lines, one per model (bench/plot.py's format)
        for r in rows:
            f.write(json.dumps(dict(common, **r)) + '\n')
    print('wrote', args.out)
    return 0


if __name__ == '__main__':
    sys.exit(main())
