#!/usr/bin/env python3
"""Compares a device suite's run on the simulator with its run on a real GPU.

Each input is the JSON a device test binary writes with PSKV_TEST_RESULTS_JSON=path
(tests/support/device_results.cc): per test its outcome, an FNV-1a checksum of every device
result it compared, and the copy counters. Results must be equal bit for bit (checksum,
number and bytes of results) and counters byte for byte in every test that passed on both.

  scripts/gpu-compare.py SIM.json GPU.json [--name NAME] [--out REPORT.json]

Prints one line per difference and a summary; exit 0 when nothing differs, 1 when a result
or a counter differs, a test failed or ran on one side only, 2 on unreadable input.
A test skipped on either side is "not compared" (listed, not a failure)."""
import argparse
import json
import sys

RESULT_FIELDS = ('checksum', 'results', 'result_bytes')


def load(path):
    with open(path, encoding='utf-8') as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or not isinstance(doc.get('tests'), list):
        raise ValueError('%s: not a device results file (no "tests" list)' % path)
    by_name = {}
    for t in doc['tests']:
        by_name[t['test']] = t
    return doc.get('backend', '?'), by_name


def compare(sim, gpu):
    """Returns a report: lists of equal, differing (with reasons) and uncompared tests."""
    report = {'equal': [], 'differ': [], 'not_compared': []}
    for name in sorted(set(sim) | set(gpu)):
        s, g = sim.get(name), gpu.get(name)
        if s is None or g is None:
            report['differ'].append({'test': name, 'why': 'ran on the %s only' % ('gpu' if s is None else 'simulator')})
            continue
        outcomes = (s['outcome'], g['outcome'])
        if 'failed' in outcomes:
            report['differ'].append({'test': name, 'why': 'failed (simulator: %s, gpu: %s)' % outcomes})
            continue
        if 'skipped' in outcomes:
            report['not_compared'].append({'test': name, 'why': 'skipped (simulator: %s, gpu: %s)' % outcomes})
            continue
        why = []
        for f in RESULT_FIELDS:
            if s.get(f) != g.get(f):
                why.append('result %s: simulator %s, gpu %s' % (f, s.get(f), g.get(f)))
        sc, gc = s.get('counters', {}), g.get('counters', {})
        for f in sorted(set(sc) | set(gc)):
            if sc.get(f) != gc.get(f):
                why.append('counter %s: simulator %s, gpu %s' % (f, sc.get(f), gc.get(f)))
        if why:
            report['differ'].append({'test': name, 'why': '; '.join(why)})
        else:
            report['equal'].append(name)
    return report


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('sim')
    ap.add_argument('gpu')
    ap.add_argument('--name', default='device suite')
    ap.add_argument('--out')
    a = ap.parse_args(argv)
    try:
        sim_backend, sim = load(a.sim)
        gpu_backend, gpu = load(a.gpu)
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
        print('gpu-compare: %s: cannot read the results: %s' % (a.name, e), file=sys.stderr)
        return 2
    report = compare(sim, gpu)
    report.update(name=a.name, sim_backend=sim_backend, gpu_backend=gpu_backend)
    for d in report['differ']:
        print('gpu-compare: %s: DIFFERS %s: %s' % (a.name, d['test'], d['why']))
    for d in report['not_compared']:
        print('gpu-compare: %s: not compared %s: %s' % (a.name, d['test'], d['why']))
    print('gpu-compare: %s (simulator: %s, gpu: %s): %d equal bit for bit, %d differ, %d not compared'
          % (a.name, sim_backend, gpu_backend, len(report['equal']), len(report['differ']),
             len(report['not_compared'])))
    if a.out:
        with open(a.out, 'w', encoding='utf-8') as f:
            json.dump(report, f, indent=1)
    return 1 if report['differ'] else 0


if __name__ == '__main__':
    sys.exit(main())
