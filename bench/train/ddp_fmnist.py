#!/usr/bin/python3
"""The baseline of bench/train: the same LeNet/MLP, data, partitioning and batch
sizes as examples/train_fmnist.py, synchronised by PyTorch's own
DistributedDataParallel with the gloo backend.

    ddp_fmnist.py --world-size 2 --rank R --port P [--network lenet] [--max-batches N]
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'examples'))
import train_fmnist as ex  # noqa: E402  (model and data helpers shared with the pskv example)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--world-size', type=int, required=True)
    ap.add_argument('--rank', type=int, required=True)
    ap.add_argument('--port', type=int, required=True)
    ap.add_argument('--network', default='lenet')
    ap.add_argument('--batch-size', type=int, default=64)
    ap.add_argument('--lr', type=float, default=0.05)
    ap.add_argument('--max-batches', type=int, default=0)
    ap.add_argument('--seed', type=int, default=42)
    ap.add_argument('--data-dir', default='/usr/share/datasets/fashion-mnist')
    ap.add_argument('--metrics-out', default='')
    a = ap.parse_args()
    dist.init_process_group('gloo', init_method='tcp://127.0.0.1:%d' % a.port, rank=a.rank,
                            world_size=a.world_size)
    nw, rank = a.world_size, a.rank
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // nw))
    torch.manual_seed(a.seed)
    x_train, y_train = ex.read_idx(a.data_dir, True)
    x_test, y_test = ex.read_idx(a.data_dir, False)
    model = torch.nn.parallel.DistributedDataParallel(ex.LeNet() if a.network == 'lenet' else ex.mlp())
    # same update as pskv: summed loss, rescaled by the global batch, SGD momentum 0.9
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    n = len(y_train)
    lo, hi = n * rank // nw, n * (rank + 1) // nw
    epoch_size = math.ceil((n // nw) / a.batch_size)
    if a.max_batches:
        epoch_size = min(epoch_size, a.max_batches)
    rng = np.random.default_rng(a.seed * 1000 + rank)
    order = rng.permutation(np.arange(lo, hi))
    t0, seen = time.time(), 0
    for b in range(epoch_size):
        idx = order[b * a.batch_size:(b + 1) * a.batch_size]
        # DDP averages gradients over workers; with a loss summed over the local batch
        # and divided by the local batch, the step equals pskv's (sum / global batch).
        loss = torch.nn.functional.nll_loss(model(ex.normalise(x_train[idx])),
                                            torch.from_numpy(y_train[idx].astype(np.int64)),
                                            reduction='sum') / a.batch_size
        opt.zero_grad()
        loss.backward()
        opt.step()
        seen += len(idx)
    secs = time.time() - t0
    if rank == 0:
        model.eval()
        with torch.no_grad():
            acc = float((model(ex.normalise(x_test)).argmax(1).numpy() == y_test).mean())
        rec = {'epoch': 1, 'test_accuracy': acc, 'seconds': secs, 'samples_per_sec': seen * nw / secs,
               'workers': nw, 'kvstore': 'torch_ddp_gloo'}
        print(json.dumps(rec), flush=True)
        if a.metrics_out:
            with open(a.metrics_out, 'a') as f:
                f.write(json.dumps(rec) + '\n')
    dist.destroy_process_group()


if __name__ == '__main__':
    main()
