"""The GPU check's bookkeeping, without a GPU: the simulator-vs-GPU comparator
(scripts/gpu-compare.py) on fabricated results, and the ledger (scripts/gpu-ledger.py) with
the warning `make test` prints, in a temporary git repository."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPARE = os.path.join(ROOT, 'scripts', 'gpu-compare.py')
LEDGER = os.path.join(ROOT, 'scripts', 'gpu-ledger.py')


def run(*args, cwd=None):
    p = subprocess.run([sys.executable] + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, cwd=cwd, timeout=60)
    return p.returncode, p.stdout


COUNTERS = {'d2h_bytes': 4096, 'd2h_count': 2, 'h2d_bytes': 4096, 'h2d_count': 2, 'd2d_bytes': 0,
            'd2d_count': 0, 'peer_bytes': 8192, 'peer_count': 4, 'kernel_launches': 3}


def entry(test, outcome='passed', checksum='0123456789abcdef', **counters):
    c = dict(COUNTERS)
    c.update(counters)
    return {'test': test, 'outcome': outcome, 'checksum': checksum, 'results': 3, 'result_bytes': 4096,
            'counters': c}


def write(path, backend, tests):
    with open(path, 'w') as f:
        json.dump({'backend': backend, 'tests': tests}, f)
    return str(path)


def compare(tmp_path, sim, gpu):
    out = tmp_path / 'report.json'
    rc, text = run(COMPARE, write(tmp_path / 'sim.json', 'simulated', sim),
                   write(tmp_path / 'gpu.json', 'cuda', gpu), '--name', 'suite', '--out', str(out))
    return rc, text, json.loads(out.read_text()) if out.exists() else None


def test_equal_results_and_counters_pass(tmp_path):
    rc, text, report = compare(tmp_path, [entry('A.a'), entry('A.b')], [entry('A.b'), entry('A.a')])
    assert rc == 0, text
    assert '2 equal bit for bit, 0 differ, 0 not compared' in text
    assert report['equal'] == ['A.a', 'A.b']


def test_a_different_checksum_fails_naming_the_test(tmp_path):
    rc, text, report = compare(tmp_path, [entry('A.a'), entry('A.b')],
                               [entry('A.a'), entry('A.b', checksum='0123456789abcdee')])
    assert rc == 1
    assert 'DIFFERS A.b: result checksum: simulator 0123456789abcdef, gpu 0123456789abcdee' in text
    assert report['equal'] == ['A.a'] and report['differ'][0]['test'] == 'A.b'


def test_a_different_counter_fails_naming_the_counter(tmp_path):
    rc, text, _ = compare(tmp_path, [entry('A.a')], [entry('A.a', d2h_bytes=4097)])
    assert rc == 1
    assert 'counter d2h_bytes: simulator 4096, gpu 4097' in text


def test_a_test_on_one_side_only_or_failed_fails(tmp_path):
    rc, text, _ = compare(tmp_path, [entry('A.a'), entry('A.b')], [entry('A.a', outcome='failed')])
    assert rc == 1
    assert 'DIFFERS A.a: failed (simulator: passed, gpu: failed)' in text
    assert 'DIFFERS A.b: ran on the simulator only' in text


def test_a_skipped_test_is_listed_not_compared(tmp_path):
    rc, text, report = compare(tmp_path, [entry('A.a'), entry('A.b')],
                               [entry('A.a'), entry('A.b', outcome='skipped', checksum='x')])
    assert rc == 0, text
    assert 'not compared A.b: skipped (simulator: passed, gpu: skipped)' in text
    assert '1 equal bit for bit, 0 differ, 1 not compared' in text


def test_unreadable_results_are_an_error(tmp_path):
    (tmp_path / 'gpu.json').write_text('{"tests": ')  # a binary that crashed mid-write
    rc, text = run(COMPARE, write(tmp_path / 'sim.json', 'simulated', []), str(tmp_path / 'gpu.json'))
    assert rc == 2 and 'cannot read the results' in text


# ---- the ledger

def git(repo, *args):
    subprocess.run(['git', '-C', str(repo), '-c', 'user.name=t', '-c', 'user.email=t@t'] + list(args),
                   check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return subprocess.run(['git', '-C', str(repo), 'rev-parse', 'HEAD'], stdout=subprocess.PIPE,
                          text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / 'repo'
    (r / 'src' / 'device' / 'cuda').mkdir(parents=True)
    (r / 'src' / 'device' / 'cuda' / 'kernels.cu').write_text('// kernels\n')
    (r / 'src' / 'device' / 'kernel_ops.h').write_text('// ops\n')
    (r / 'src' / 'other.cc').write_text('// other\n')
    subprocess.run(['git', 'init', '-q', str(r)], check=True)
    git(r, 'add', '.')
    git(r, 'commit', '-qm', 'first')
    return r


def gpu_check_out(tmp_path, commit, gpu_tests_ran=40, status=0, name='out'):
    out = tmp_path / name
    out.mkdir()
    (out / 'summary.json').write_text(json.dumps({
        'commit': commit, 'date': '2026-11-29T06:00:00Z', 'gpu': 'NVIDIA H200', 'driver': '550.54.15',
        'compute_capability': '90-real', 'tests': 120, 'failures': 0, 'skipped': 10,
        'gpu_tests_ran': gpu_tests_ran, 'compute_sanitizer': 'passed', 'status': status}))
    (out / 'compare_runtime.json').write_text(json.dumps(
        {'name': 'runtime', 'equal': ['A.a', 'A.b'], 'differ': [], 'not_compared': ['A.c']}))
    (out / 'bench_device.json').write_text(json.dumps({'sum_vs_d2d': 0.91}))
    return out


def status(repo, ledger):
    rc, text = run(LEDGER, 'status', '--ledger', str(ledger), '--repo', str(repo))
    assert rc == 0, text
    return text


def test_no_entry_says_never_ran(repo, tmp_path):
    ledger = tmp_path / 'gpu-ledger.json'
    assert 'never ran on a real GPU' in status(repo, ledger)
    ledger.write_text('[]\n')
    assert 'never ran on a real GPU' in status(repo, ledger)


def test_an_entry_and_the_warning_when_the_cuda_layer_changes(repo, tmp_path):
    ledger = tmp_path / 'gpu-ledger.json'
    ledger.write_text('[]\n')
    first = git(repo, 'rev-parse', 'HEAD')
    rc, text = run(LEDGER, 'record', '--ledger', str(ledger), '--out-dir', str(gpu_check_out(tmp_path, first)))
    assert rc == 0, text
    entries = json.loads(ledger.read_text())
    assert len(entries) == 1
    e = entries[0]
    assert (e['commit'], e['gpu'], e['driver'], e['tests_run'], e['tests_passed']) == \
        (first, 'NVIDIA H200', '550.54.15', 120, 110)
    assert e['sim_vs_gpu'] == {'runtime': {'equal': 2, 'differ': 0, 'not_compared': 1}}
    assert e['figures'] == {'sum_vs_d2d': 0.91} and e['passed']

    text = status(repo, ledger)
    assert 'last ran on a real GPU at commit %s' % first[:12] in text and 'NVIDIA H200' in text
    assert 'WARNING' not in text

    # A change outside the CUDA layer: no warning.
    (repo / 'src' / 'other.cc').write_text('// changed\n')
    git(repo, 'commit', '-qam', 'other')
    assert 'WARNING' not in status(repo, ledger)

    # An uncommitted change of a kernel: warned, naming the file.
    (repo / 'src' / 'device' / 'cuda' / 'kernels.cu').write_text('// changed\n')
    text = status(repo, ledger)
    assert 'WARNING: the CUDA backend or the kernels changed since %s' % first[:12] in text
    assert 'kernels.cu' in text

    # Committed, and kernel_ops.h too: still warned.
    (repo / 'src' / 'device' / 'kernel_ops.h').write_text('// changed\n')
    second = git(repo, 'commit', '-qam', 'kernels')
    text = status(repo, ledger)
    assert 'kernel_ops.h' in text and 'kernels.cu' in text

    # A later run on a GPU at the new commit: appended (the first entry kept), no warning.
    rc, text = run(LEDGER, 'record', '--ledger', str(ledger),
                   '--out-dir', str(gpu_check_out(tmp_path, second, name='out2')))
    assert rc == 0, text
    entries = json.loads(ledger.read_text())
    assert [x['commit'] for x in entries] == [first, second]
    text = status(repo, ledger)
    assert second[:12] in text and 'WARNING' not in text


def test_a_failed_check_and_an_unknown_commit_are_said(repo, tmp_path):
    ledger = tmp_path / 'gpu-ledger.json'
    rc, _ = run(LEDGER, 'record', '--ledger', str(ledger),
                '--out-dir', str(gpu_check_out(tmp_path, '0' * 40, status=1)))
    assert rc == 0
    text = status(repo, ledger)
    assert 'THE CHECK FAILED' in text
    assert 'WARNING: commit 000000000000 is not in this repository' in text


def test_no_entry_without_gpu_tests(repo, tmp_path):
    ledger = tmp_path / 'gpu-ledger.json'
    ledger.write_text('[]\n')
    head = git(repo, 'rev-parse', 'HEAD')
    rc, text = run(LEDGER, 'record', '--ledger', str(ledger),
                   '--out-dir', str(gpu_check_out(tmp_path, head, gpu_tests_ran=0)))
    assert rc == 3 and 'the GPU tests did not run' in text
    assert json.loads(ledger.read_text()) == []


def test_a_malformed_ledger_is_an_error(repo, tmp_path):
    ledger = tmp_path / 'gpu-ledger.json'
    ledger.write_text('{"commit": "x"}')
    rc, text = run(LEDGER, 'status', '--ledger', str(ledger), '--repo', str(repo))
    assert rc == 2 and 'JSON list' in text


def test_the_repository_ledger_is_a_list():
    with open(os.path.join(ROOT, 'docs', 'gpu-ledger.json')) as f:
        assert isinstance(json.load(f), list)


def test_make_test_prints_the_ledger_status(tmp_path):
    # scripts/run-tests.sh (what `make test` runs) on a build directory with one test.
    (tmp_path / 'CTestTestfile.cmake').write_text('add_test(ok /bin/true)\n')
    p = subprocess.run(['bash', os.path.join(ROOT, 'scripts', 'run-tests.sh'), str(tmp_path), '1'],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert p.returncode == 0, p.stdout
    assert 'gpu-ledger: the CUDA layer ' in p.stdout.splitlines()[-1] or 'gpu-ledger: WARNING' in p.stdout
