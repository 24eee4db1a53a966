#!/usr/bin/python3
"""train_fmnist.py: the C++ example's training job with pskv.torch.

    PYTHONPATH=build/python build/pskv-launch -n 2 -s 1 -- \\
        /usr/bin/python3 examples/train_fmnist.py --kv-store dist_sync --epochs 2

Each worker trains on its part of Fashion-MNIST (num_parts = workers, part_index =
rank) with the same number of batches per epoch; rank 0 prints progress and the
test accuracy after every epoch.
"""
import argparse
import gzip
import json
import math
import os
import sys
import time

import numpy as np
import torch

import pskv
import pskv.torch


def read_idx(data_dir, train):
    p = 'train' if train else 't10k'
    with gzip.open(os.path.join(data_dir, p + '-images-idx3-ubyte.gz')) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(os.path.join(data_dir, p + '-labels-idx1-ubyte.gz')) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    return x, y


def normalise(x):
    return torch.from_numpy((x.astype(np.float32) / 255 - 0.2860) / 0.3530)


class LeNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 20, 5)
        self.conv2 = torch.nn.Conv2d(20, 50, 5)
        self.fc1 = torch.nn.Linear(800, 500)
        self.fc2 = torch.nn.Linear(500, 10)

    def forward(self, x):
        x = torch.max_pool2d(torch.tanh(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.tanh(self.conv2(x)), 2)
        x = torch.tanh(self.fc1(x.flatten(1)))
        return torch.log_softmax(self.fc2(x), 1)


def mlp():
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10),
                               torch.nn.LogSoftmax(dim=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--kv-store', default='local')
    ap.add_argument('--network', default='lenet', choices=['lenet', 'mlp'])
    ap.add_argument('--epochs', type=int, default=2)
    ap.add_argument('--batch-size', type=int, default=64, help='per worker')
    ap.add_argument('--lr', type=float, default=0.05)
    ap.add_argument('--optimizer', default='sgd')
    ap.add_argument('--update-on-kvstore', type=int, default=1)
    ap.add_argument('--gc-type', default='none')
    ap.add_argument('--gc-threshold', type=float, default=0.5)
    ap.add_argument('--seed', type=int, default=42)
    ap.add_argument('--data-dir', default='/usr/share/datasets/fashion-mnist')
    ap.add_argument('--metrics-out', default='')
    ap.add_argument('--max-batches', type=int, default=0)
    args = ap.parse_args()

    pskv.configure_process(tune_allocator=True)  # PSKV_* logging/metrics; allocator for big tensors
    kv = pskv.create(args.kv_store)  # a server/scheduler process never returns from here
    rank, nw = kv.rank, kv.num_workers
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // nw))
    torch.manual_seed(args.seed)
    x_train, y_train = read_idx(args.data_dir, True)
    x_test, y_test = read_idx(args.data_dir, False)

    model = LeNet() if args.network == 'lenet' else mlp()
    kwargs = {'learning_rate': args.lr}
    if args.optimizer in ('sgd', 'nag'):
        kwargs['momentum'] = 0.9
    opt = pskv.optimizer.create(args.optimizer, **kwargs)
    gc = {'type': args.gc_type, 'threshold': args.gc_threshold} if args.gc_type != 'none' else None
    # loss summed over the batch (reduction='sum' below); gradients pushed during backward
    trainer = pskv.torch.Trainer(model.parameters(), opt, kv, loss_reduction='sum',
                                 global_batch_size=args.batch_size * nw,
                                 update_on_kvstore=bool(args.update_on_kvstore), compression_params=gc,
                                 push_in_backward=True)

    # num_parts / part_index partitioning and the same number of batches everywhere (spec 7.1, 7.2)
    n = len(y_train)
    lo, hi = n * rank // nw, n * (rank + 1) // nw
    epoch_size = math.ceil((n // nw) / args.batch_size)
    if args.max_batches:
        epoch_size = min(epoch_size, args.max_batches)
    for epoch in range(args.epochs):
        rng = np.random.default_rng(args.seed * 1000 + epoch * 10 + rank)
        order = np.concatenate([rng.permutation(np.arange(lo, hi))
                                for _ in range(math.ceil(epoch_size * args.batch_size / (hi - lo)))])
        t0, loss_sum, seen = time.time(), 0.0, 0
        for b in range(epoch_size):
            idx = order[b * args.batch_size:(b + 1) * args.batch_size]
            loss = torch.nn.functional.nll_loss(model(normalise(x_train[idx])),
                                                torch.from_numpy(y_train[idx].astype(np.int64)), reduction='sum')
            loss.backward()
            trainer.step()
            loss_sum += loss.item()
            seen += len(idx)
            if rank == 0 and (b % 50 == 0 or b + 1 == epoch_size):
                print('epoch %d %d/%d batches  %.0f samples/s  loss %.4f' % (
                    epoch + 1, b + 1, epoch_size, seen * nw / (time.time() - t0), loss_sum / seen), flush=True)
        secs = time.time() - t0
        if rank == 0:
            model.eval()
            with torch.no_grad():
                acc = float((model(normalise(x_test)).argmax(1).numpy() == y_test).mean())
            model.train()
            print('epoch %d: train loss %.4f, test accuracy %.4f, %.1f s, %.0f samples/s' % (
                epoch + 1, loss_sum / seen, acc, secs, seen * nw / secs), flush=True)
            if args.metrics_out:
                with open(args.metrics_out, 'a') as f:
                    f.write(json.dumps({'epoch': epoch + 1, 'train_loss': loss_sum / seen, 'test_accuracy': acc,
                                        'seconds': secs, 'samples_per_sec': seen * nw / secs,
                                        'workers': nw, 'kvstore': kv.type}) + '\n')
    kv.barrier()
    return 0


if __name__ == '__main__':
    sys.exit(main())
