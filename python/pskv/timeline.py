"""Merging the per-process timelines of a job (``PSKV_TIMELINE``) into one trace.

With ``PSKV_TIMELINE=/tmp/job/trace.json`` every process of a job writes its own file,
``/tmp/job/trace.<role>.<pid>.json`` (several processes may share a directory, or run
on other hosts). ``merge`` puts them into one Chrome trace (``chrome://tracing``,
ui.perfetto.dev) with one process lane per node, named as the node (``worker[1]``,
``server[0]``, ``scheduler``), ordered scheduler, servers, workers::

    python3 -m pskv.timeline merge /tmp/job -o job.json
    python3 -m pskv.timeline merge /tmp/job/trace.json -o job.json   # the PSKV_TIMELINE value

Timestamps are each host's wall clock in microseconds: processes on one host line up
exactly, across hosts as well as their clocks agree. A file whose process was killed
before it closed its trace (no final ``]``) is read up to its last complete event.
"""
import argparse
import glob
import json
import os
import re
import sys

__all__ = ['merge', 'timeline_files']

_NAME = re.compile(r'\.(scheduler|server|worker)\.(\d+)\.json$')
_ORDER = {'scheduler': 0, 'server': 1, 'worker': 2}


def timeline_files(path):
    """The per-process timeline files that ``path`` names.

    Parameters
    ----------
    path : str
        A directory (its ``*.<role>.<pid>.json`` files), the ``PSKV_TIMELINE`` value of
        the job (``dir/trace.json``: the files ``dir/trace.*.*.json``), or one file.

    Returns
    -------
    list of str
        The files, sorted by name.
    """
    if os.path.isdir(path):
        found = glob.glob(os.path.join(path, '*.json'))
    elif os.path.isfile(path) and _NAME.search(path):
        found = [path]
    else:
        stem, ext = os.path.splitext(path)
        found = glob.glob(glob.escape(stem) + '.*.*' + (ext or ''))
    return sorted(f for f in found if _NAME.search(f))


def _events(path):
    """The events of one file, tolerating a trace cut short (no closing bracket)."""
    text = open(path, encoding='utf-8').read()
    try:
        return json.loads(text)
    except ValueError:
        pass
    # Events are written one per line, each after ",\n": drop a torn last line.
    lines = text.rstrip().split('\n')
    while lines:
        body = '\n'.join(lines).rstrip().rstrip(',').rstrip(']')
        try:
            return json.loads(body + '\n]')
        except ValueError:
            lines.pop()
    raise ValueError('%s is not a pskv timeline (no JSON events in it)' % path)


def merge(paths, out):
    """Merges per-process timelines into one Chrome trace with a lane per node.

    Parameters
    ----------
    paths : str or list of str
        Directories, ``PSKV_TIMELINE`` values or files (see :func:`timeline_files`).
    out : str
        The merged trace to write (JSON object format, ``traceEvents``).

    Returns
    -------
    list of str
        The lane names, in order (``['scheduler', 'server[0]', 'worker[0]', ...]``).

    Raises
    ------
    FileNotFoundError
        When ``paths`` name no timeline file.
    """
    if isinstance(paths, str):
        paths = [paths]
    files = []
    for p in paths:
        files += [f for f in timeline_files(p) if os.path.abspath(f) != os.path.abspath(out)]
    if not files:
        raise FileNotFoundError('no PSKV_TIMELINE files (NAME.<role>.<pid>.json) in %s' % ', '.join(paths))
    procs = []
    for f in sorted(set(files)):
        role, pid = _NAME.search(f).groups()
        events = _events(f)
        label = None
        for e in events:
            if e.get('ph') == 'M' and e.get('name') == 'process_labels':
                label = e.get('args', {}).get('labels')
        rank = re.search(r'\[(\d+)\]', label or '')
        first = min((e['ts'] for e in events if 'ts' in e), default=0)
        procs.append({'file': f, 'role': role, 'pid': int(pid), 'events': events,
                      'label': label or role,
                      'key': (_ORDER.get(role, 3), int(rank.group(1)) if rank else 1 << 30, first)})
    procs.sort(key=lambda p: p['key'])
    merged = []
    names = []
    for lane, p in enumerate(procs, 1):
        # Lanes are numbered anew: pids of processes on different hosts may collide.
        name = p['label']
        names.append(name)
        merged.append({'name': 'process_name', 'ph': 'M', 'pid': lane,
                       'args': {'name': '%s (pid %d, %s)' % (name, p['pid'], os.path.basename(p['file']))}})
        merged.append({'name': 'process_sort_index', 'ph': 'M', 'pid': lane, 'args': {'sort_index': lane}})
        for e in p['events']:
            if e.get('ph') == 'M' and e.get('name') in ('process_name', 'process_labels', 'process_sort_index'):
                continue
            e = dict(e, pid=lane)
            merged.append(e)
    with open(out, 'w', encoding='utf-8') as f:
        json.dump({'traceEvents': merged, 'displayTimeUnit': 'ms'}, f)
        f.write('\n')
    return names


def main(argv=None):
    """``python3 -m pskv.timeline merge PATH... -o OUT``.

    Parameters
    ----------
    argv : list of str, optional
        The arguments (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit status.
    """
    ap = argparse.ArgumentParser(prog='python3 -m pskv.timeline',
                                 description='Merges the per-process PSKV_TIMELINE files of a job into one '
                                 'Chrome trace (chrome://tracing, ui.perfetto.dev), one lane per node.')
    sub = ap.add_subparsers(dest='cmd', required=True)
    m = sub.add_parser('merge', help='merge the files of a job')
    m.add_argument('paths', nargs='+', metavar='PATH',
                   help='a directory, the PSKV_TIMELINE value (dir/trace.json) or files')
    m.add_argument('-o', '--out', required=True, help='the merged trace to write (e.g. job.json)')
    args = ap.parse_args(argv)
    try:
        names = merge(args.paths, args.out)
    except (OSError, ValueError) as e:
        print('pskv.timeline: %s' % e, file=sys.stderr)
        return 1
    print('%s: %d processes (%s)' % (args.out, len(names), ', '.join(names)))
    return 0


if __name__ == '__main__':
    sys.exit(main())
