"""Python's optimizers against the C++ field table (src/kvstore/optimizer_fields.h),
which Python reads through the binding (pskv.optimizer.params): every name a Python
optimizer or schedule sends is a field of the table, every field of the table is
accepted by every Python optimizer, and every built-in type has a class."""
import inspect

import numpy as np
import pytest

import pskv
from pskv import _pskv
from pskv import lr_scheduler
from pskv import optimizer as opt

# Constructor arguments that Python turns into table fields itself: the schedule object
# (-> lr_scheduler, lr_step, ...) and key names (-> lr_mult, wd_mult keys).
PY_ONLY = {'self', 'kwargs', 'lr_scheduler', 'param_idx2name'}
# Table fields that Python takes through other means than a keyword argument: the
# schedule object and set_lr_mult/set_wd_mult (sum_keys: the Trainer's buffers).
NOT_KWARGS = {'lr_scheduler', 'lr_mult', 'wd_mult'}


def table():
    return opt.params()


def names():
    return {p['name'] for p in table()} | {p['alias'] for p in table() if p['alias']}


def test_table_describes_every_field():
    fields = table()
    assert [p['name'] for p in fields][:3] == ['learning_rate', 'wd', 'rescale_grad']
    for p in fields:
        assert set(p) == {'name', 'alias', 'type', 'default', 'range', 'doc'}
        assert p['doc'], p['name']
    byname = {p['name']: p for p in fields}
    assert byname['momentum']['range'] == 'must be in [0, 1)'
    assert byname['learning_rate']['alias'] == 'lr'
    assert float(byname['learning_rate']['default']) == 0.01


def test_constructor_parameters_and_sent_parameters_are_fields():
    known = names()
    for cls in [opt.Optimizer] + list(opt._REGISTRY.values()):
        sig = set(inspect.signature(cls.__init__).parameters) - PY_ONLY
        assert sig <= known, (cls.__name__, sig - known)
        sent = (cls if cls is not opt.Optimizer else opt.SGD)().params()
        assert set(sent) <= known, (cls.__name__, set(sent) - known)
    for sched in (lr_scheduler.FactorScheduler(step=2), lr_scheduler.MultiFactorScheduler(step=[2, 4]),
                  lr_scheduler.CosineScheduler(max_update=10)):
        assert set(sched.params(0.1)) <= known, type(sched).__name__


def value(p):
    """A field's default as a Python caller would write it."""
    text = p['default']
    if p['type'] == 'float':
        return float(text)
    if p['type'] == 'int':
        return int(text)
    if p['type'] == 'bool':
        return bool(int(text))
    if p['type'] == 'ints':
        return [int(x) for x in text.split(',') if x]
    return text


@pytest.mark.parametrize('name', sorted(opt._REGISTRY))
def test_every_field_is_accepted_by_every_optimizer(name):
    # Python's accepted keywords are the table's: each field, given as a keyword at
    # its default, reaches the C++ core, which takes it and keeps that value.
    for p in table():
        if p['name'] in NOT_KWARGS:
            continue
        o = opt.create(name, **{p['name']: value(p)})
        text = '\n' + _pskv.Optimizer(o.name, o.params()).serialize()
        if p['default'] or p['type'] == 'ints':  # (empty key sets are left out of the text)
            assert '\n%s=%s\n' % (p['name'], p['default']) in text, (p['name'], text)
    with pytest.raises(pskv.InvalidArgument, match='no_such_param'):
        opt.create(name, no_such_param=1).create_updater()


def test_every_builtin_type_has_a_class():
    builtin = ['sgd', 'nag', 'adam', 'adamw', 'rmsprop', 'adagrad']
    assert _pskv.optimizer_types()[:len(builtin)] == builtin
    assert sorted(opt._REGISTRY) == sorted(builtin)
    with pytest.raises(pskv.InvalidArgument, match='valid: adagrad, adam, adamw, nag, rmsprop, sgd'):
        opt.create('lamb')


def test_updater_runs_the_rule_of_the_table_defaults():
    # Keywords spelled as the table's aliases work too (MXNet's lr).
    w = np.ones(3, dtype=np.float32)
    opt.create('sgd', lr=0.5).create_updater()(0, np.full(3, 2, dtype=np.float32), w)
    np.testing.assert_array_equal(w, np.zeros(3, dtype=np.float32))


@pytest.mark.parametrize('name', sorted(opt._REGISTRY))
def test_python_defaults_are_the_cores(name):
    # A Python optimizer left at its defaults configures the core exactly as the
    # core's own defaults for the type (OptimizerConfig::For): one source of truth.
    o = opt.create(name)
    assert _pskv.Optimizer(o.name, o.params()).serialize() == _pskv.Optimizer(name, {}).serialize()
    lr = float([p for p in opt.params(name) if p['name'] == 'learning_rate'][0]['default'])
    assert o.learning_rate == lr
    assert opt.create(name, learning_rate=0.25).learning_rate == 0.25
    assert opt.create(name, lr=0.25).learning_rate == 0.25  # MXNet's alias


def test_per_type_defaults_are_mxnets():
    assert opt.Adam().learning_rate == 0.001 and opt.RMSProp().learning_rate == 0.001
    assert opt.SGD().learning_rate == 0.01
    text = _pskv.Optimizer('adagrad', opt.AdaGrad().params()).serialize()
    assert '\nepsilon=9.9999999999999995e-08\n' in '\n' + text, text
