"""A PyTorch training script on pskv: what a DDP script becomes (README, "Your PyTorch
script on 2 workers").

    PYTHONPATH=build/python build/pskv-launch -n 2 -s 1 -- /usr/bin/python3 examples/pytorch_quickstart.py

A small classifier on synthetic data (no files, a few seconds): every worker trains on
its part of the data, the server sums the gradients and runs SGD with momentum, and
every worker ends with the same weights. Rank 0 prints the loss of each epoch.
"""
import torch

import pskv
import pskv.torch

kv = pskv.create('dist_sync')  # was: dist.init_process_group('gloo'); the launcher sets the job up
torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(2048, 20), torch.randint(0, 4, (2048,)))
data.tensors[0][:, :4] += 2 * torch.nn.functional.one_hot(data.tensors[1], 4)  # learnable
model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
# was: model = DDP(model); opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
trainer = pskv.torch.Trainer(model, pskv.optimizer.SGD(learning_rate=0.1, momentum=0.9), kv,
                             loss_reduction='mean')
# was: DistributedSampler(data)
sampler = pskv.torch.Sampler(data, batch_size=64, num_parts=kv.num_workers, part_index=kv.rank)
loader = torch.utils.data.DataLoader(data, batch_size=64, sampler=sampler)
for epoch in range(3):
    sampler.set_epoch(epoch)
    total, n = 0.0, 0
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        trainer.step()  # was: opt.step(); opt.zero_grad()
        total, n = total + loss.item(), n + 1
    if kv.rank == 0:
        print('epoch %d: loss %.4f (%d workers)' % (epoch, total / n, kv.num_workers), flush=True)
weights = torch.cat([p.detach().flatten() for p in model.parameters()])
print('worker %d: done, weights checksum %.6f' % (kv.rank, float(weights.double().sum())), flush=True)
