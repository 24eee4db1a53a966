"""The C++ and the Python Trainer agree: every scenario of tests/trainer_scenarios.json
runs over both front ends (tests/frontends/trainer_scenario.cc, trainer_scenario.py), which
must report bit-identical weights and buffers, the same update_on_kvstore, learning
rate and optimizer configuration, write byte-identical states files, and meet the
scenario's `expect`. Both run the same operations in the same order on the same
store types, so nothing is compared with a tolerance."""
import json
import os
import subprocess

import pytest

pytest.importorskip('torch')
BUILD = os.path.abspath(os.environ.get('PSKV_BUILD_DIR', os.path.join(os.path.dirname(__file__), '..', '..', 'build')))
HERE = os.path.dirname(os.path.abspath(__file__))
TABLE = os.path.join(HERE, '..', 'trainer_scenarios.json')
CPP = os.path.join(BUILD, 'tests', 'trainer_scenario')
PY = os.path.join(HERE, 'trainer_scenario.py')

with open(TABLE) as _f:
    _TABLE = json.load(_f)


def scenario(name):
    sc = dict(_TABLE['defaults'])
    sc.update(next(s for s in _TABLE['scenarios'] if s['name'] == name))
    return sc


def flatten(sc, states):
    """The scenario as the runners' `name=value` lines."""
    def tri(v):
        return 'none' if v is None else str(v)
    lines = {
        'store': sc['store'], 'optimizer': sc['optimizer'],
        'uok': 'none' if sc['update_on_kvstore'] is None else str(int(sc['update_on_kvstore'])),
        'loss_reduction': tri(sc['loss_reduction']), 'global_batch_size': str(sc['global_batch_size']),
        'batch_size': str(sc['batch_size']),
        'lr_mult': ','.join('%s:%r' % (k, float(v)) for k, v in sorted(sc['lr_mult'].items())),
        'wd_mult': ','.join('%s:%r' % (k, float(v)) for k, v in sorted(sc['wd_mult'].items())),
        'sparse': str(int(sc['sparse'])), 'buffers': str(int(sc['buffers'])),
        'push_in_backward': str(int(sc['push_in_backward'])), 'actions': ','.join(sc['actions']),
        'states': states,
    }
    for k, v in sc['optimizer_params'].items():
        lines['opt.' + k] = v
    return ''.join('%s=%s\n' % kv for kv in lines.items())


def run(sc, front, tmp_path):
    """Runs one front end ('cpp' or 'py'); returns its reports by rank."""
    spec = tmp_path / ('%s.scenario' % front)
    spec.write_text(flatten(sc, str(tmp_path / ('%s.states' % front))))
    cmd = [CPP] if front == 'cpp' else ['/usr/bin/python3', PY]
    cmd += [str(spec), str(tmp_path)]
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, 'python'))
    env.pop('MXNET_UPDATE_ON_KVSTORE', None)
    env.update(sc['env'])
    if sc['workers'] > 1:
        cmd = [os.path.join(BUILD, 'pskv-launch'), '-n', str(sc['workers']), '-s', '1', '--timeout', '90',
               '--'] + cmd
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=150)
    assert p.returncode == 0, p.stdout.decode()
    reports = []
    for r in range(sc['workers']):
        with open(tmp_path / ('%s%d.json' % (front, r))) as f:
            reports.append(json.load(f))
    return reports


@pytest.mark.skipif(not os.path.exists(CPP), reason='built without libtorch (no trainer_scenario)')
@pytest.mark.parametrize('name', [s['name'] for s in _TABLE['scenarios']])
def test_both_trainers_agree(name, tmp_path):
    sc = scenario(name)
    cpp, py = run(sc, 'cpp', tmp_path), run(sc, 'py', tmp_path)
    for r in range(sc['workers']):
        for field in ('update_on_kvstore', 'learning_rate', 'config', 'weights', 'buffer'):
            assert cpp[r][field] == py[r][field], (name, r, field, cpp[r][field], py[r][field])
    # every worker ends with rank 0's dense weights (dist_sync; a sparse table holds
    # the rows each worker pulled)
    for r in range(1, sc['workers']):
        assert py[r]['weights'][:2] == py[0]['weights'][:2]
    for field, want in sc.get('expect', {}).items():
        assert py[0][field] == want, (name, field, py[0][field])
    if 'save' in sc['actions']:
        a, b = (tmp_path / 'cpp.states').read_bytes(), (tmp_path / 'py.states').read_bytes()
        assert a == b, name
    # the run moved the weights (the scenario does not compare two no-ops)
    assert py[0]['weights'] != run_initial(sc)


def run_initial(sc):
    """Rank 0's initial weights as the runners report them."""
    import importlib.util
    spec = importlib.util.spec_from_file_location('trainer_scenario', PY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    shapes = [(4, 3), (3,)] + ([(6, 2)] if sc['sparse'] else [])
    return [mod.hexof(mod.init(s, i, 0)) for i, s in enumerate(shapes)]
