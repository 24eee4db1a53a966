"""Trains an MLP with pskv.torch for a few steps on Fashion-MNIST and writes the
final parameters (rank 0). Worker w's batch s is slice w of the batch a single
process with the doubled batch uses, so the results must agree."""
import gzip
import sys

import numpy as np
import torch

import pskv
import pskv.torch


def main(out, kvtype, uok, batch, steps):
    kv = pskv.create(kvtype)
    n, rank = kv.num_workers, kv.rank
    torch.set_num_threads(1)
    with gzip.open('/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz') as f:
        x_all = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
    with gzip.open('/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz') as f:
        y_all = np.frombuffer(f.read(), np.uint8, offset=8)
    torch.manual_seed(10 + rank)  # differs per worker on purpose: broadcast must fix it
    model = torch.nn.Sequential(torch.nn.Linear(784, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10),
                                torch.nn.LogSoftmax(dim=1))
    trainer = pskv.torch.Trainer(model.parameters(), pskv.optimizer.SGD(learning_rate=0.1, momentum=0.9),
                                 kv, global_batch_size=batch * n, update_on_kvstore=uok)
    for s in range(steps):
        lo = (s * n + rank) * batch
        x = torch.from_numpy(x_all[lo:lo + batch].astype(np.float32) / 255)
        y = torch.from_numpy(y_all[lo:lo + batch].astype(np.int64))
        torch.nn.functional.nll_loss(model(x), y, reduction='sum').backward()
        trainer.step()
    if rank == 0:
        np.concatenate([p.detach().numpy().ravel() for p in model.parameters()]).tofile(out)
    kv.barrier()


if __name__ == '__main__':
    main(sys.argv[1], sys.argv[2], sys.argv[3] == '1', int(sys.argv[4]), int(sys.argv[5]))
