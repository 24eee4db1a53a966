"""pskv-launch --launcher kubernetes: the generated manifests, checked structurally
(parsed with PyYAML; every field a pod needs). No cluster runs here, and kubectl's
client-side dry run needs an API server for discovery, so `--apply` is checked with a
stand-in `kubectl` on PATH that records its arguments and stdin: the secret must
reach kubectl on stdin only."""
import os
import stat
import subprocess

import pytest

yaml = pytest.importorskip('yaml')

BUILD = os.path.abspath(os.environ.get('PSKV_BUILD_DIR', os.path.join(os.path.dirname(__file__), '..', '..', 'build')))
LAUNCH = os.path.join(BUILD, 'pskv-launch')
SECRET = 'k8s-secret-value-for-the-test'
CONTRACT = ['DMLC_ROLE', 'DMLC_PS_ROOT_URI', 'DMLC_PS_ROOT_PORT', 'DMLC_NUM_WORKER', 'DMLC_NUM_SERVER',
            'DMLC_NODE_HOST', 'PSKV_JOB_ID', 'PSKV_JOB_SECRET']


def launch(args, env_extra=None, path=None):
    env = dict(os.environ, PSKV_JOB_SECRET=SECRET)
    env.update(env_extra or {})
    if path:
        env['PATH'] = path + os.pathsep + env['PATH']
    p = subprocess.run([LAUNCH] + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def docs(text):
    return [d for d in yaml.safe_load_all(text) if d is not None]


def env_of(container):
    return {e['name']: e for e in container['env']}


def test_indexed_jobs_and_headless_service():
    rc, out, err = launch(['-n', '3', '-s', '2', '--launcher', 'kubernetes', '--image', 'reg/me/train:1',
                           '--job-name', 'mnist', '--namespace', 'ml', '--cpu', '2', '--memory', '4Gi',
                           '--env', 'A=1', '--env-worker', 'W=x "quoted": y', '--', 'python3', 'train.py',
                           '--lr', '0.1'])
    assert rc == 0, err
    assert SECRET not in out + err
    objs = docs(out)
    by = {(o['kind'], o['metadata']['name']): o for o in objs}
    assert set(by) == {('Secret', 'mnist-secret'), ('Service', 'mnist-scheduler'), ('Job', 'mnist-scheduler'),
                       ('Job', 'mnist-server'), ('Job', 'mnist-worker')}
    for o in objs:
        assert o['metadata']['namespace'] == 'ml'
        assert o['metadata']['labels']['pskv/job'] == 'mnist'
    secret = by[('Secret', 'mnist-secret')]
    assert secret['stringData'] == {'PSKV_JOB_SECRET': '<secret>'}  # masked when printed
    svc = by[('Service', 'mnist-scheduler')]
    assert svc['spec']['clusterIP'] == 'None' and svc['spec']['publishNotReadyAddresses'] is True
    port = svc['spec']['ports'][0]['port']
    counts = {'scheduler': 1, 'server': 2, 'worker': 3}
    for role, count in counts.items():
        job = by[('Job', 'mnist-' + role)]
        spec = job['spec']
        assert spec['completionMode'] == 'Indexed'
        assert spec['completions'] == count and spec['parallelism'] == count
        assert spec['backoffLimit'] == 0
        pod = spec['template']
        assert pod['spec']['restartPolicy'] == 'Never'
        labels = pod['metadata']['labels']
        if role == 'scheduler':  # the Service selects exactly the scheduler's pod
            assert all(labels.get(k) == v for k, v in svc['spec']['selector'].items())
        else:
            assert not all(labels.get(k) == v for k, v in svc['spec']['selector'].items())
        (c,) = pod['spec']['containers']
        assert c['image'] == 'reg/me/train:1'
        assert c['resources']['requests'] == {'cpu': '2', 'memory': '4Gi'} == c['resources']['limits']
        env = env_of(c)
        for k in CONTRACT:
            assert k in env, (role, k)
        assert env['DMLC_ROLE']['value'] == role
        assert env['DMLC_PS_ROOT_URI']['value'] == 'mnist-scheduler.ml.svc'
        assert env['DMLC_PS_ROOT_PORT']['value'] == str(port)
        assert env['DMLC_NUM_WORKER']['value'] == '3' and env['DMLC_NUM_SERVER']['value'] == '2'
        assert env['DMLC_NODE_HOST']['valueFrom']['fieldRef']['fieldPath'] == 'status.podIP'
        assert env['PSKV_JOB_SECRET']['valueFrom']['secretKeyRef'] == {'name': 'mnist-secret',
                                                                       'key': 'PSKV_JOB_SECRET'}
        assert 'value' not in env['PSKV_JOB_SECRET']
        assert env['A']['value'] == '1'
        if role == 'worker':
            assert c['command'] == ['python3', 'train.py', '--lr', '0.1']
            assert env['W']['value'] == 'x "quoted": y'  # quoting survives
            assert 'job-completion-index' in env['DMLC_TASK_ID']['valueFrom']['fieldRef']['fieldPath']
        else:
            assert c['command'] == ['pskv-server'] and 'W' not in env
        if role == 'scheduler':
            assert c['ports'][0]['containerPort'] == port


def test_mxjob_for_kubeflow():
    rc, out, err = launch(['-n', '2', '-s', '1', '--launcher', 'kubernetes', '--k8s-kind', 'mxjob', '--image', 'img',
                           '--job-name', 'mx', '--server-command', 'python3 train.py', '--', 'python3', 'train.py'])
    assert rc == 0, err
    assert SECRET not in out
    objs = docs(out)
    assert [o['kind'] for o in objs] == ['Secret', 'MXJob']
    mx = objs[1]
    assert mx['apiVersion'] == 'kubeflow.org/v1' and mx['spec']['jobMode'] == 'MXTrain'
    specs = mx['spec']['mxReplicaSpecs']
    assert {k: v['replicas'] for k, v in specs.items()} == {'Scheduler': 1, 'Server': 1, 'Worker': 2}
    for kind, spec in specs.items():
        (c,) = spec['template']['spec']['containers']
        assert c['name'] == 'mxnet'  # the training operator's container name
        env = env_of(c)
        assert 'DMLC_ROLE' not in env  # the operator sets the DMLC_* contract
        assert env['PSKV_JOB_SECRET']['valueFrom']['secretKeyRef']['name'] == 'mx-secret'
        assert c['command'] == (['python3', 'train.py'] if kind == 'Worker' else
                                ['/bin/sh', '-c', 'python3 train.py'])
    assert specs['Scheduler']['template']['spec']['containers'][0]['ports'][0]['name'] == 'mxjob-port'


def test_apply_sends_the_secret_on_kubectls_stdin_only(tmp_path):
    fake = tmp_path / 'kubectl'
    fake.write_text('#!/bin/sh\nprintf "%%s\\n" "$@" > %s/args\ncat > %s/stdin\necho "applied"\n' % (tmp_path, tmp_path))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    rc, out, err = launch(['-n', '1', '-s', '1', '--launcher', 'kubernetes', '--image', 'img', '--job-name', 'j1',
                           '--apply', '--', 'prog'], path=str(tmp_path))
    assert rc == 0, out + err
    args = (tmp_path / 'args').read_text().split()
    assert args == ['apply', '-f', '-'], args
    sent = docs((tmp_path / 'stdin').read_text())
    assert sent[0]['kind'] == 'Secret' and sent[0]['stringData']['PSKV_JOB_SECRET'] == SECRET
    assert SECRET not in out + err
    assert 'applied' in out and 'kubectl -n default get pods -l pskv/job=j1' in err
    rc, out, err = launch(['-n', '1', '--launcher', 'kubernetes', '--image', 'img', '--apply', '--dry-run', '--',
                           'prog'], path=str(tmp_path))
    assert rc == 0 and (tmp_path / 'args').read_text().split() == ['apply', '-f', '-', '--dry-run=client']


def test_usage_errors():
    rc, out, err = launch(['-n', '1', '--launcher', 'kubernetes', '--', 'prog'])
    assert rc == 2 and '--image' in err
    rc, out, err = launch(['-n', '1', '--launcher', 'kubernetes', '--image', 'i', '--job-name', 'Bad_Name', '--',
                           'prog'])
    assert rc == 2 and 'not a Kubernetes name' in err
    rc, out, err = launch(['-n', '1', '--apply', '--', 'prog'])
    assert rc == 2 and '--apply is for --launcher kubernetes' in err


def test_kubectl_client_dry_run_when_an_api_server_is_reachable(tmp_path):
    """kubectl's client-side dry run still asks an API server for its resource types;
    on this machine none runs, so this test skips (saying why) unless kubectl has a
    reachable cluster configured."""
    import shutil
    if not shutil.which('kubectl'):
        pytest.skip('kubectl not installed (Debian: kubernetes-client)')
    rc, out, err = launch(['-n', '2', '-s', '1', '--launcher', 'kubernetes', '--image', 'img', '--job-name', 'dry',
                           '--', 'prog'])
    assert rc == 0, err
    manifest = tmp_path / 'job.yaml'
    manifest.write_text(out)
    p = subprocess.run(['kubectl', 'apply', '--dry-run=client', '-f', str(manifest)], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=60)
    text = p.stdout.decode()
    if p.returncode != 0 and ('connection refused' in text or 'couldn\'t get current server' in text or
                              'failed to download openapi' in text or 'no configuration' in text):
        pytest.skip('kubectl --dry-run=client needs an API server; none is reachable here')
    assert p.returncode == 0, text
    for obj in ('secret/dry-secret', 'service/dry-scheduler', 'job.batch/dry-scheduler', 'job.batch/dry-server',
                'job.batch/dry-worker'):
        assert obj in text, text
