"""The layering of src/ (docs/design.md, "Map") holds: every `#include "..."` of a
file under src/ names a folder its layer may include (LAYERS below, the same table
as the design notes), and the protocol layer includes none of the KV application's
public headers. Reads the sources only; needs no build.

A new folder under src/ gets a row here and a section in docs/design.md; an include
that this test refuses is either a layering leak to fix or a new edge to state in
both places."""
import os
import re

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
SRC = os.path.join(ROOT, 'src')

# Layer (a folder of src/; a file belongs to the longest one that contains it) ->
# the folders of src/ it may include besides its own. `include/pskv/` (the public
# API, `pskv/...`) is open to every layer except where FORBIDDEN_PUBLIC says.
LAYERS = {
    'common': set(),
    'device': {'common'},
    'ndarray': {'common', 'device'},
    'sparse': {'common'},
    'protocol': {'common'},
    'transport': {'common'},
    'transport/zmq': {'common', 'transport'},
    'transport/upgrade': {'common', 'transport', 'transport/zmq'},
    'transport/shm': {'common', 'transport', 'transport/upgrade'},
    'transport/tcp': {'common', 'transport', 'transport/upgrade'},
    'transport/fault': {'common', 'transport'},
    'ps': {'common', 'protocol', 'transport', 'transport/fault'},
    'kvstore': {'common', 'device', 'ndarray', 'sparse', 'protocol', 'ps'},
    'kvstore/distributed/wire': {'common', 'sparse', 'protocol', 'kvstore', 'embedding'},
    'kvstore/distributed': {'common', 'sparse', 'protocol', 'ps', 'kvstore',
                            'kvstore/distributed/wire'},
    'kvstore/distributed/worker': {'common', 'device', 'ndarray', 'sparse', 'protocol', 'ps',
                                   'kvstore', 'kvstore/distributed',
                                   'kvstore/distributed/wire', 'embedding'},
    'kvstore/distributed/server': {'common', 'device', 'ndarray', 'sparse', 'protocol', 'ps',
                                   'kvstore', 'kvstore/distributed',
                                   'kvstore/distributed/wire', 'embedding'},
    'embedding': {'common', 'device', 'kvstore'},
    'launcher': {'common', 'transport'},
    'trainer': set(),
    'torch': set(),
    'data': set(),
}
# Sub-folders that are parts of their parent's layer, not layers of their own.
PARTS = {'device/sim': 'device', 'device/cuda': 'device', 'launcher/plans': 'launcher'}

# Public headers a layer must not include: the bottom layer knows element types, not
# arrays or stores; the wire format knows codecs and node-level kinds, not the KV
# store's or the optimizer's types.
FORBIDDEN_PUBLIC = {
    'common': {'pskv/ndarray.h', 'pskv/row_sparse.h', 'pskv/kvstore.h', 'pskv/optimizer.h',
               'pskv/update_rule.h', 'pskv/store_type.h', 'pskv/torch.h',
               'pskv/trainer_policy.h'},
    'protocol': {'pskv/kvstore.h', 'pskv/optimizer.h', 'pskv/update_rule.h',
                 'pskv/row_sparse.h', 'pskv/store_type.h', 'pskv/torch.h',
                 'pskv/trainer_policy.h'},
}
# Files allowed an edge their layer's row does not grant (file -> layers), with the
# reason.
EXCEPTIONS = {
    # The one file that puts a dist store together from both sides.
    'kvstore/kvstore_dist.cc': {'kvstore/distributed/worker', 'kvstore/distributed/server'},
    # What workers and servers say: a range copy's part is a replication-wire type.
    'kvstore/dist_protocol.h': {'kvstore/distributed/wire'},
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of(rel):
    """The layer of a path relative to src/ (a file or an included header)."""
    folder = os.path.dirname(rel)
    while folder:
        if folder in PARTS:
            return PARTS[folder]
        if folder in LAYERS:
            return folder
        folder = os.path.dirname(folder)
    return None


def sources():
    for root, _, files in os.walk(SRC):
        for f in sorted(files):
            if f.endswith(('.h', '.cc', '.cu')):
                yield os.path.relpath(os.path.join(root, f), SRC)


def violations():
    out = []
    for rel in sources():
        own = layer_of(rel)
        if own is None:
            out.append(f'src/{rel}: its folder has no row in LAYERS (tests/python/'
                       'test_layering.py) and no section in docs/design.md')
            continue
        with open(os.path.join(SRC, rel), errors='replace') as fh:
            for n, line in enumerate(fh, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                inc = m.group(1)
                where = f'src/{rel}:{n}: #include "{inc}"'
                if inc.startswith('pskv/'):
                    if inc in FORBIDDEN_PUBLIC.get(own, ()):
                        out.append(f'{where}: {own}/ must not include {inc}')
                    continue
                if '/' not in inc:
                    continue  # a header next to the file (trainer_impl.h)
                target = layer_of(inc)
                if target is None:
                    out.append(f'{where}: {inc} is in no layer')
                elif target != own and target not in LAYERS[own] and \
                        target not in EXCEPTIONS.get(rel, ()):
                    out.append(f'{where}: {own}/ may include only '
                               f'{", ".join(sorted(LAYERS[own])) or "include/pskv"} '
                               f'(docs/design.md, "Map")')
    return out


def test_every_include_follows_the_layering():
    bad = violations()
    assert not bad, 'layering broken:\n' + '\n'.join(bad)


def test_no_two_folders_include_each_other():
    """The table itself has no cycle (a layer lower down never grants a higher one)."""
    def reaches(a, b, seen=()):
        return any(x == b or (x not in seen and reaches(x, b, seen + (x,)))
                   for x in LAYERS[a] if x in LAYERS)
    cycles = [a for a in LAYERS if reaches(a, a)]
    assert not cycles, f'layers that reach themselves: {cycles}'


@pytest.mark.parametrize('rel, expected', [
    ('protocol/payload.h', 'protocol'),
    ('device/cuda/kernels.h', 'device'),
    ('kvstore/distributed/server/dist_server.h', 'kvstore/distributed/server'),
    ('kvstore/distributed/link_pacing.h', 'kvstore/distributed'),
    ('kvstore/kvstore.cc', 'kvstore'),
])
def test_layer_of(rel, expected):
    assert layer_of(rel) == expected
