"""bench/plot.py turns benchmark records into PNG plots (matplotlib, Agg)."""
import os
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))


def test_plots_from_the_committed_records(tmp_path):
    pytest.importorskip('matplotlib')
    import matplotlib.image as mpimg
    results = os.path.join(ROOT, 'bench', 'results')
    files = [os.path.join(results, f) for f in ('train.json', 'pushpull.json', 'reduce.json')]
    p = subprocess.run(['/usr/bin/python3', os.path.join(ROOT, 'bench', 'plot.py'), '--out', str(tmp_path)] + files,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    assert p.returncode == 0, p.stdout.decode()
    for name in ('train.png', 'pushpull.png', 'reduce.png'):
        path = tmp_path / name
        assert path.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
        img = mpimg.imread(str(path))
        assert img.shape[0] > 200 and img.shape[1] > 400, img.shape


def test_no_records_is_an_error(tmp_path):
    empty = tmp_path / 'empty.json'
    empty.write_text('not json\n')
    p = subprocess.run(['/usr/bin/python3', os.path.join(ROOT, 'bench', 'plot.py'), '--out', str(tmp_path), str(empty)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    assert p.returncode != 0 and b'no benchmark records' in p.stdout
