"""pskv-launch's -H rule for missing host files, and what a real shell executes for the
batch systems that cannot run here (SGE, YARN): the launcher runs for real against
stand-in `qsub` and `yarn` programs that record their arguments and then do what the
real ones would do with them (qsub runs the job script once per array task; YARN's
distributed shell runs -shell_command through a shell with the -shell_env values)."""
import glob
import os
import stat
import subprocess
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.abspath(os.environ.get('PSKV_BUILD_DIR', os.path.join(HERE, '..', '..', 'build')))
LAUNCH = os.path.join(BUILD, 'pskv-launch')


@pytest.fixture(autouse=True)
def need_launcher():
    if not os.path.exists(LAUNCH):
        pytest.skip('build pskv-launch first')


def run(args, cwd=None, env=None, timeout=60):
    return subprocess.run([LAUNCH] + args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_missing_host_file_is_an_error_unless_clearly_a_host(tmp_path):
    r = run(['-n', '2', '-H', 'hosts', '--dry-run', '--', 'prog'], cwd=str(tmp_path))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "-H 'hosts': no such host file" in r.stderr and '-H hosts:SLOTS (e.g. hosts:1) or -H hosts,' in r.stderr, r.stderr
    r = run(['-n', '2', '-H', 'conf/hosts', '--dry-run', '--', 'prog'], cwd=str(tmp_path))
    assert r.returncode == 2 and 'no such host file (check the path)' in r.stderr, r.stderr
    # clearly host names: with slots, as a list, an IPv4 literal, localhost
    for h, name in (('node1:2', 'node1'), ('node1,', 'node1'), ('10.1.2.3', '10.1.2.3'),
                    ('localhost', 'localhost'), ('a,b', 'b')):
        r = run(['-n', '2', '-s', '1', '-H', h, '--dry-run', '--', 'prog'], cwd=str(tmp_path))
        assert r.returncode == 0, (h, r.stderr)
        assert 'BatchMode=yes -p 22 %s ' % name in r.stdout, (h, r.stdout)
    # an existing file is a host file, whatever its name
    (tmp_path / 'hosts').write_text('node7\n')
    r = run(['-n', '1', '-s', '1', '-H', 'hosts', '--dry-run', '--', 'prog'], cwd=str(tmp_path))
    assert r.returncode == 0 and ' node7 ' in r.stdout, r.stdout + r.stderr


def stand_in(path, body):
    path.write_text('#!/bin/bash\n' + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def recorder(tmp_path):
    """A program that records its role, task id and arguments (one file per call)."""
    rec = tmp_path / 'rec'
    rec.mkdir()
    stand_in(tmp_path / 'record', '''
        f="%s/$DMLC_ROLE-${DMLC_TASK_ID:-x}-$$"
        { echo "role=$DMLC_ROLE task=${DMLC_TASK_ID:-} workers=$DMLC_NUM_WORKER"; printf '[%%s]' "$@"; echo; } > "$f"
    ''' % rec)
    return rec


def records(rec):
    return sorted(open(rec / f).read() for f in os.listdir(rec))


def test_yarn_command_as_a_shell_runs_it(tmp_path):
    rec = recorder(tmp_path)
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    # yarn: records its argv, then runs -shell_command num_containers times through a
    # shell with the -shell_env values, as the distributed shell's containers do
    stand_in(bin_dir / 'yarn', '''
        printf '%%s\\n' "$@" > "%s/yarn-argv-$$"
        n=1; cmd=; envs=()
        while [ $# -gt 0 ]; do case "$1" in
          -num_containers) n=$2; shift 2;; -shell_command) cmd=$2; shift 2;;
          -shell_env) envs+=("$2"); shift 2;; *) shift;; esac; done
        for i in $(seq 1 $n); do env "${envs[@]}" DMLC_TASK_ID=$((i-1)) sh -c "$cmd" || exit 1; done
    ''' % tmp_path)
    env = dict(os.environ, PATH='%s:%s' % (bin_dir, os.environ['PATH']), HADOOP_YARN_HOME='/opt/hadoop 3')
    r = run(['-n', '2', '-s', '1', '--launcher', 'yarn', '--no-secret', '--server-command', str(tmp_path / 'record'),
             '--', str(tmp_path / 'record'), 'x y', "it's"], env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    argvs = [open(tmp_path / f).read().splitlines() for f in os.listdir(tmp_path) if f.startswith('yarn-argv-')]
    assert len(argvs) == 2
    for a in argvs:
        # the variable was expanded by a shell (and its space kept inside one word)
        assert a[a.index('-jar') + 1] == \
            '/opt/hadoop 3/share/hadoop/yarn/hadoop-yarn-applications-distributedshell.jar', a
    got = records(rec)
    assert sum('role=worker' in g and "[x y][it's]" in g for g in got) == 2, got
    # the scheduler and its standby (started by default) run next to the launcher
    assert sum('role=server' in g for g in got) == 1 and sum('role=scheduler' in g for g in got) == 2, got
    assert {g.split()[1] for g in got if 'role=worker' in g} == {'task=0', 'task=1'}, got

    # HADOOP_YARN_HOME unset: the shell says what to set, nothing runs with a bad path
    env.pop('HADOOP_YARN_HOME')
    r = run(['-n', '1', '-s', '1', '--launcher', 'yarn', '--no-secret', '--server-command', 'true', '--', 'true'],
            env=env, cwd=str(tmp_path))
    assert r.returncode != 0
    assert 'HADOOP_YARN_HOME' in r.stdout + r.stderr and 'is not set' in r.stdout + r.stderr, r.stdout


def test_sge_script_as_qsub_runs_it(tmp_path):
    rec = recorder(tmp_path)
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    # qsub -t 1-N SCRIPT: runs the script once per array task with SGE_TASK_ID (its
    # environment: -V), as the execution hosts would
    stand_in(bin_dir / 'qsub', '''
        t=; script=
        while [ $# -gt 0 ]; do case "$1" in -t) t=$2; shift 2;; -N) shift 2;; -sync) shift 2;; -*) shift;;
          *) script=$1; shift;; esac; done
        for i in $(seq ${t%%-*} ${t##*-}); do SGE_TASK_ID=$i sh "$script" || exit 1; done
    ''')
    env = dict(os.environ, PATH='%s:%s' % (bin_dir, os.environ['PATH']))
    before = set(glob.glob('/tmp/pskv-*.sh'))
    r = run(['-n', '3', '-s', '2', '--launcher', 'sge', '--no-secret', '--server-command', str(tmp_path / 'record'),
             '--', str(tmp_path / 'record'), 'x y', '$HOME'], env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    got = records(rec)
    workers = [g for g in got if 'role=worker' in g]
    assert sorted(g.split()[1] for g in workers) == ['task=0', 'task=1', 'task=2'], got
    assert all('[x y][$HOME]' in g and 'workers=3' in g for g in workers), got
    assert sorted(g.split()[1] for g in got if 'role=server' in g) == ['task=0', 'task=1'], got
    # the job scripts the launcher wrote are gone with the job
    assert set(glob.glob('/tmp/pskv-*.sh')) <= before, sorted(set(glob.glob('/tmp/pskv-*.sh')) - before)
