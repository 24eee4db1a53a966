"""One scenario of tests/trainer_scenarios.json with pskv.torch.Trainer: the Python
twin of tests/frontends/trainer_scenario.cc (keep them line for line equivalent).

    trainer_scenario.py SCENARIO_FILE OUT_DIR   -> OUT_DIR/py<rank>.json
"""
import json
import sys

import numpy as np
import torch

import pskv
import pskv.torch
from pskv import _pskv


def read_scenario(path):
    with open(path) as f:
        return dict(line.rstrip('\n').split('=', 1) for line in f if '=' in line)


def mults(v):
    return {int(k): float(x) for k, x in (item.split(':') for item in v.split(',') if item)}


# The generators of the scenario table (trainer_scenario.cc: the same float64
# arithmetic, then float32).
def init(shape, i, rank):
    n = int(np.prod(shape))
    v = [0.5 - 0.0625 * float((7 * j + 3 * i) % 11) + float(rank) for j in range(n)]
    return torch.tensor(np.array(v, dtype=np.float64).astype(np.float32)).reshape(shape)


def grad(n, i, step, rank):
    v = [float(j % 5 - 2) * 0.25 + 0.125 * (step + 1) * (rank + 1) * (i + 1) for j in range(n)]
    return torch.tensor(np.array(v, dtype=np.float64).astype(np.float32))


def hexof(t):
    return t.detach().contiguous().numpy().tobytes().hex()


def run(sc, out_dir):
    kv = pskv.create(sc['store'])
    rank = kv.rank
    sparse = sc['sparse'] == '1'
    params = [init((4, 3), 0, rank).requires_grad_(True), init((3,), 1, rank).requires_grad_(True)]
    if sparse:
        params.append(init((6, 2), 2, rank).requires_grad_(True))
    buffer = torch.zeros(2)

    op = {k[4:]: v for k, v in sc.items() if k.startswith('opt.')}
    lr_mult, wd_mult = mults(sc['lr_mult']), mults(sc['wd_mult'])
    groups = []
    for i, p in enumerate(params):
        g = {'params': [p]}
        if i in lr_mult:
            g['lr_mult'] = lr_mult[i]
        if i in wd_mult:
            g['wd_mult'] = wd_mult[i]
        groups.append(g)
    t = pskv.torch.Trainer(
        groups, sc['optimizer'], op, kv,
        update_on_kvstore=None if sc['uok'] == 'none' else sc['uok'] == '1',
        loss_reduction=None if sc['loss_reduction'] == 'none' else sc['loss_reduction'],
        global_batch_size=int(sc['global_batch_size']) or None,
        push_in_backward=sc['push_in_backward'] == '1',
        sparse_params=[params[2]] if sparse else None,
        buffers=[buffer] if sc['buffers'] == '1' else [])

    batch = int(sc['batch_size']) or None
    step = 0
    for action in (a for a in sc['actions'].split(',') if a):
        if action == 'step':
            with torch.no_grad():
                for j in range(2):
                    buffer[j] = float(step * 10 + rank + j)
            loss = (params[0] * grad(12, 0, step, rank).reshape(4, 3)).sum() + \
                (params[1] * grad(3, 1, step, rank)).sum()
            if sparse:
                ids = torch.tensor([(step + rank) % 6, (step + 2 * rank + 3) % 6])
                rows = torch.nn.functional.embedding(ids, params[2], sparse=True)
                loss = loss + (rows * grad(4, 2, step, rank).reshape(2, 2)).sum()
            loss.backward()
            t.step(batch)
            step += 1
        elif action.startswith('set_lr:'):
            t.set_learning_rate(float(action[7:]))
        elif action == 'save':
            t.save_states(sc['states'])
        elif action == 'load':
            t.load_states(sc['states'])
        else:
            raise pskv.InvalidArgument('unknown action ' + action)
    config = _pskv.Optimizer(t._name, t.optimizer_config).serialize()
    with open('%s/py%d.json' % (out_dir, rank), 'w') as f:
        json.dump({'update_on_kvstore': t.update_on_kvstore, 'learning_rate': t.learning_rate, 'config': config,
                   'weights': [hexof(p) for p in params], 'buffer': hexof(buffer)}, f)


if __name__ == '__main__':
    torch.set_num_threads(1)
    run(read_scenario(sys.argv[1]), sys.argv[2])
