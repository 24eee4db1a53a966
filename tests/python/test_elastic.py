"""KVStore.epoch_partition and KVStore.epoch from Python (elastic workers:
docs/fault-tolerance.md, "Elastic workers")."""
import os
import subprocess
import sys

import pytest

import pskv

BUILD = os.path.abspath(os.environ.get('PSKV_BUILD_DIR', os.path.join(os.path.dirname(__file__), '..', '..', 'build')))
LAUNCH = os.path.join(BUILD, 'pskv-launch')

WORKER = r'''
import pskv
kv = pskv.create('dist_sync')
assert kv.epoch == -1, kv.epoch
for e in range(3):
    parts = kv.epoch_partition()
    assert parts == (kv.num_workers, kv.rank), parts
    assert isinstance(parts, tuple) and kv.epoch == e, (parts, kv.epoch)
kv.close()
print('epochs passed')
'''


def test_local_store_deals_one_part_and_counts_epochs():
    kv = pskv.create('local')
    assert kv.epoch == -1
    assert kv.epoch_partition() == (1, 0)
    assert kv.epoch == 0
    assert kv.epoch_partition() == (1, 0)
    assert kv.epoch == 1
    kv.close()
    with pytest.raises(pskv.UsageError):
        kv.epoch_partition()


def test_elastic_job_deals_the_workers_in_the_job(tmp_path):
    # Under pskv-launch --min-workers (PSKV_ELASTIC=1): every epoch passes the workers'
    # epoch barrier and is dealt over the 2 workers, by rank; epoch counts the releases.
    script = tmp_path / 'epochs.py'
    script.write_text(WORKER)
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, 'python'))
    p = subprocess.run([LAUNCH, '-n', '2', '-s', '1', '--min-workers', '1', '--timeout', '60', '--',
                        sys.executable, str(script)],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=90)
    out = p.stdout.decode()
    assert p.returncode == 0, out
    assert out.count('epochs passed') == 2, out
