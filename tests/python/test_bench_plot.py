"""bench/plot.py turns benchmark records into PNG plots (matplotlib, Agg)."""
import os
import struct
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))


def test_plots_from_the_committed_records(tmp_path):
    # matplotlib runs in the subprocess only: importing it here would change when this
    # pytest process collects garbage (see the report on KVStore.__del__).
    if subprocess.run(['/usr/bin/python3', '-c', 'import matplotlib']).returncode != 0:
        pytest.skip('python3-matplotlib not installed')
    results = os.path.join(ROOT, 'bench', 'results')
    files = [os.path.join(results, f) for f in ('train.json', 'pushpull.json', 'reduce.json')]
    p = subprocess.run(['/usr/bin/python3', os.path.join(ROOT, 'bench', 'plot.py'), '--out', str(tmp_path)] + files,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    assert p.returncode == 0, p.stdout.decode()
    for name in ('train.png', 'pushpull.png', 'reduce.png'):
        path = tmp_path / name
        data = path.read_bytes()
        assert data[:8] == b'\x89PNG\r\n\x1a\n' and data[12:16] == b'IHDR'
        width, height = struct.unpack('>II', data[16:24])
        assert width > 400 and height > 200, (width, height)
        assert data.endswith(b'IEND\xaeB`\x82')


def test_no_records_is_an_error(tmp_path):
    empty = tmp_path / 'empty.json'
    empty.write_text('not json\n')
    p = subprocess.run(['/usr/bin/python3', os.path.join(ROOT, 'bench', 'plot.py'), '--out', str(tmp_path), str(empty)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    assert p.returncode != 0 and b'no benchmark records' in p.stdout


def test_pskv_bench_plots_itself(tmp_path):
    """pskv-bench --plot DIR keeps the JSON records and draws the PNG through plot.py;
    without matplotlib it still succeeds and says why there is no plot."""
    build = os.path.abspath(os.environ.get('PSKV_BUILD_DIR', os.path.join(ROOT, 'build')))
    p = subprocess.run([os.path.join(build, 'pskv-bench'), 'reduce', '--min-elements', '65536',
                        '--max-elements', '262144', '--plot', str(tmp_path)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    out = p.stdout.decode()
    assert p.returncode == 0, out
    records = (tmp_path / 'reduce.json').read_text().splitlines()
    assert len(records) == 2 and all('"bench":"reduce"' in r for r in records), records
    if subprocess.run(['/usr/bin/python3', '-c', 'import matplotlib']).returncode != 0:
        assert 'no plot' in out
    else:
        assert (tmp_path / 'reduce.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n', out
