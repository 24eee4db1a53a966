#!/usr/bin/env python3
"""ResNet-18 step time on one GPU: pskv's device exchange against the no-exchange step and
against DDP over gloo (issue 37, item 4; docs/performance.md, "GPU").

  python3 bench/resnet_device_bench.py [--k 2] [--batch 128] [--steps 20] [--json]

Modes, each timed as the median step (forward, backward, exchange, update) after warm-up:
  none      one replica, no exchange (the floor)
  device    k replicas on cuda:0 (logical devices, PSKV_CUDA_FAKE_DEVICES=k), pskv.torch.Trainer
            with kvstore='device' and devices=[cuda:0 x k]        goal: <= 1.1 x none
  ddp-gloo  k processes on cuda:0, DistributedDataParallel over gloo   goal: device <= ddp-gloo
(dist_sync_device with 2 workers: run this script under pskv-launch with --kv-store
dist_sync_device; it then times the device mode only.)

Needs torch with CUDA and torchvision; otherwise it prints SKIPPED with the reason and exits
77 (ctest's skip code). Figures are only meaningful on a real GPU."""
import argparse
import inspect
import json
import os
import statistics
import sys
import time

SKIP = 77


def skip(why):
    print('resnet_device_bench: SKIPPED: %s' % why)
    sys.exit(SKIP)


def model_and_batch(torch, batch, device):
    import torchvision
    m = torchvision.models.resnet18(num_classes=10).to(device)
    x = torch.randn(batch, 3, 32, 32, device=device)  # CIFAR-sized
    y = torch.randint(0, 10, (batch,), device=device)
    return m, x, y


def timed(torch, steps, step):
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t = []
    for _ in range(steps):
        s = time.perf_counter()
        step()
        torch.cuda.synchronize()
        t.append(time.perf_counter() - s)
    return statistics.median(t)


def bench_none(torch, a):
    m, x, y = model_and_batch(torch, a.batch, 'cuda:0')
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad()
        loss_fn(m(x), y).backward()
        opt.step()
    return timed(torch, a.steps, step)


def bench_device(torch, a, kvstore):
    import pskv.torch as pt
    if 'devices' not in inspect.signature(pt.Trainer.__init__).parameters:
        return None, 'pskv.torch.Trainer has no devices= (issue 37 item 2)'
    replicas = [model_and_batch(torch, a.batch, 'cuda:0') for _ in range(a.k)]
    loss_fn = torch.nn.CrossEntropyLoss()
    tr = pt.Trainer([list(m.parameters()) for m, _, _ in replicas], 'sgd', {'learning_rate': 0.01},
                    kvstore=kvstore, devices=['cuda:%d' % i for i in range(a.k)])

    def step():
        for m, x, y in replicas:
            loss_fn(m(x), y).backward()
        tr.step(a.batch * a.k)
    return timed(torch, a.steps, step), None


def ddp_worker(rank, world, a, port, out):
    import torch
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    dist.init_process_group('gloo', rank=rank, world_size=world)
    m, x, y = model_and_batch(torch, a.batch, 'cuda:0')
    ddp = torch.nn.parallel.DistributedDataParallel(m)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad()
        loss_fn(ddp(x), y).backward()
        opt.step()
    t = timed(torch, a.steps, step)
    if rank == 0:
        out.put(t)
    dist.destroy_process_group()


def bench_ddp(torch, a):
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    ctx = mp.get_context('spawn')
    q = ctx.Queue()
    mp.start_processes(ddp_worker, args=(a.k, a, port, q), nprocs=a.k, start_method='spawn')
    return q.get(timeout=60)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--k', type=int, default=2)
    ap.add_argument('--batch', type=int, default=128)
    ap.add_argument('--steps', type=int, default=20)
    ap.add_argument('--kv-store', default='device')
    ap.add_argument('--json', action='store_true')
    a = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        skip('no torch (%s)' % e)
    if not torch.cuda.is_available():
        skip('torch %s has no CUDA device (torch.cuda.is_available() is False); run on a GPU '
             'machine (scripts/gpu-check.sh)' % torch.__version__)
    try:
        import torchvision  # noqa: F401
    except ImportError as e:
        skip('no torchvision (%s)' % e)
    os.environ.setdefault('PSKV_CUDA_FAKE_DEVICES', str(a.k))  # before pskv touches a device
    res = {'bench': 'resnet18_step', 'gpu': torch.cuda.get_device_name(0), 'k': a.k, 'batch': a.batch}
    res['none_s'] = bench_none(torch, a)
    res['device_s'], why = bench_device(torch, a, a.kv_store)
    if why:
        res['device_skipped'] = why
    res['ddp_gloo_s'] = bench_ddp(torch, a)
    if res['device_s']:
        res['device_vs_none'] = res['device_s'] / res['none_s']        # goal <= 1.1
        res['ddp_gloo_vs_device'] = res['ddp_gloo_s'] / res['device_s']  # goal >= 1.0
    print(json.dumps(res) if a.json else '\n'.join('%s: %s' % kv for kv in res.items()))
    return 0


if __name__ == '__main__':
    sys.exit(main())
