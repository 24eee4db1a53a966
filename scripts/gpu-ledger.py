#!/usr/bin/env python3
"""The ledger of runs on a real GPU (docs/gpu-ledger.json, an append-only JSON list).

  scripts/gpu-ledger.py record --ledger L --out-dir OUT
      appends one entry built from scripts/gpu-check.sh's results in OUT (summary.json,
      compare_*.json, bench_device.json): commit, date, GPU model, driver, compute
      capability, tests run/passed, the comparisons, the benchmark figures. Refuses (exit 3)
      when the GPU tests did not run: the ledger records runs on a real GPU only.
  scripts/gpu-ledger.py status --ledger L [--repo DIR]
      prints which commit's CUDA layer last ran on a real GPU, and a WARNING when the CUDA
      backend or the kernels (WATCHED) changed since that commit (uncommitted changes
      included). Exit 0 (information for `make test`), 2 when the ledger is unreadable."""
import argparse
import datetime
import glob
import json
import os
import subprocess
import sys

# What only a GPU executes (docs/gpu.md): a change here is unverified until gpu-check runs.
WATCHED = ['src/device/cuda/', 'src/device/kernel_ops.h']


def read_ledger(path):
    if not os.path.exists(path):
        return []
    with open(path, encoding='utf-8') as f:
        doc = json.load(f)
    if not isinstance(doc, list):
        raise ValueError('%s: the ledger is a JSON list of entries' % path)
    return doc


def read_json(path, default=None):
    try:
        with open(path, encoding='utf-8') as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return default


def record(ledger, out_dir):
    summary = read_json(os.path.join(out_dir, 'summary.json'))
    if summary is None:
        print('gpu-ledger: no summary.json in %s' % out_dir, file=sys.stderr)
        return 2
    if summary.get('gpu_tests_ran', 0) <= 0:
        print('gpu-ledger: no entry: the GPU tests did not run (%s)'
              % (summary.get('skip_reason') or 'no GPU'), file=sys.stderr)
        return 3
    compares = {}
    for p in sorted(glob.glob(os.path.join(out_dir, 'compare_*.json'))):
        c = read_json(p, {})
        compares[c.get('name', os.path.basename(p))] = {
            'equal': len(c.get('equal', [])), 'differ': len(c.get('differ', [])),
            'not_compared': len(c.get('not_compared', []))}
    entry = {
        'commit': summary.get('commit'),
        'uncommitted_changes': summary.get('uncommitted_changes', False),
        'date': summary.get('date') or datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ'),
        'gpu': summary.get('gpu'),
        'driver': summary.get('driver'),
        'compute_capability': summary.get('compute_capability'),
        'nvcc': summary.get('nvcc'),
        'tests_run': summary.get('tests'),
        'tests_passed': summary.get('tests', 0) - summary.get('failures', 0) - summary.get('skipped', 0),
        'tests_failed': summary.get('failures'),
        'tests_skipped': summary.get('skipped'),
        'sim_vs_gpu': compares,
        'compute_sanitizer': summary.get('compute_sanitizer'),
        'figures': read_json(os.path.join(out_dir, 'bench_device.json'), {}),
        'passed': summary.get('status') == 0,
    }
    entries = read_ledger(ledger)
    entries.append(entry)
    tmp = ledger + '.tmp'
    with open(tmp, 'w', encoding='utf-8') as f:
        json.dump(entries, f, indent=1)
        f.write('\n')
    os.replace(tmp, ledger)
    print('gpu-ledger: entry %d recorded in %s (commit %s, %s, %s/%s tests passed)'
          % (len(entries), ledger, entry['commit'], entry['gpu'], entry['tests_passed'], entry['tests_run']))
    return 0


def status(ledger, repo):
    entries = read_ledger(ledger)
    if not entries:
        print('gpu-ledger: the CUDA layer never ran on a real GPU (no entry in %s; run '
              'scripts/gpu-check.sh OUT on a GPU machine, docs/gpu.md)' % os.path.relpath(ledger, repo))
        return 0
    last = entries[-1]
    commit = last.get('commit') or '?'
    print('gpu-ledger: the CUDA layer last ran on a real GPU at commit %s (%s, %s, driver %s): %s/%s tests passed%s'
          % (commit[:12], last.get('date'), last.get('gpu'), last.get('driver'),
             last.get('tests_passed'), last.get('tests_run'), '' if last.get('passed') else ', THE CHECK FAILED'))
    if subprocess.run(['git', '-C', repo, 'cat-file', '-e', commit + '^{commit}'],
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
        print('gpu-ledger: WARNING: commit %s is not in this repository: whether the CUDA layer '
              'changed since is unknown' % commit[:12])
        return 0
    diff = subprocess.run(['git', '-C', repo, 'diff', '--stat', commit, '--'] + WATCHED,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout.strip()
    if diff:
        print('gpu-ledger: WARNING: the CUDA backend or the kernels changed since %s, never run on '
              'a GPU since (run scripts/gpu-check.sh on a GPU machine):' % commit[:12])
        for line in diff.splitlines():
            print('  ' + line)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    sub = ap.add_subparsers(dest='cmd', required=True)
    r = sub.add_parser('record')
    r.add_argument('--ledger', required=True)
    r.add_argument('--out-dir', required=True)
    s = sub.add_parser('status')
    s.add_argument('--ledger', required=True)
    s.add_argument('--repo', default='.')
    a = ap.parse_args(argv)
    try:
        if a.cmd == 'record':
            return record(a.ledger, a.out_dir)
        return status(a.ledger, a.repo)
    except (OSError, ValueError, json.JSONDecodeError) as e:
        print('gpu-ledger: cannot read the ledger: %s' % e, file=sys.stderr)
        return 2


if __name__ == '__main__':
    sys.exit(main())
