"""The dist checkpoint recipe of :mod:`pskv.torch`: the model on rank 0, the
optimizer states gathered by the Trainer (docs/coming-from-ddp.md)."""
import os

import torch as _torch


def save_checkpoint(prefix, model, trainer, **meta):
    """The dist checkpoint recipe, save side: call on every worker.

    The optimizer states are gathered collectively; rank 0 writes `prefix.pt` (model
    state_dict and `meta`) and `prefix.states` (optimizer states and optimizer).
    Returns after the files are complete on every worker.

    Parameters
    ----------
    prefix : str
        Path prefix of the two files.
    model : torch.nn.Module
        The model.
    trainer : Trainer
        Its Trainer.
    **meta
        Saved with the model, e.g. ``epoch=3``.
    """
    trainer.save_states(prefix + '.states')
    if trainer.kv.rank == 0:
        tmp = '%s.pt.tmp%d' % (prefix, os.getpid())
        _torch.save({'model': model.state_dict(), 'meta': meta}, tmp)
        os.replace(tmp, prefix + '.pt')
    trainer.kv.barrier()


def load_checkpoint(prefix, model):
    """The resume side, part 1: call on every worker BEFORE creating the Trainer.

    The Trainer broadcasts these weights and the store starts from them. Part 2,
    after creating the Trainer: ``trainer.load_states(prefix + '.states')``.

    Parameters
    ----------
    prefix : str
        Path prefix given to :func:`save_checkpoint`.
    model : torch.nn.Module
        Receives the saved weights.

    Returns
    -------
    dict or None
        The saved `meta`, or None if there is no checkpoint.
    """
    if not os.path.exists(prefix + '.pt'):
        return None
    saved = _torch.load(prefix + '.pt')
    model.load_state_dict(saved['model'])
    return saved['meta']
