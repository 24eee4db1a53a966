"""pskv.synthetic: Criteo-shaped synthetic click data (issue 41 item 8) - deterministic per
seed, parts disjoint and covering, Zipf-distributed ids, a label a model can learn."""
import numpy as np
import pytest

import pskv
import pskv.synthetic as syn


def test_deterministic_per_seed_and_independent_of_how_it_is_read():
    a = syn.CriteoSynthetic(20000, seed=5)
    b = syn.CriteoSynthetic(20000, seed=5)
    whole = a.read(0, 20000)
    for x, y in zip(whole, b.read(0, 20000)):
        np.testing.assert_array_equal(x, y)
    # Read in odd pieces (across the generator's chunks) or in batches: the same samples.
    pieces = [a.read(lo, hi) for lo, hi in [(0, 1), (1, 8191), (8191, 8193), (8193, 20000)]]
    for k in range(3):
        np.testing.assert_array_equal(np.concatenate([p[k] for p in pieces]), whole[k])
    batched = list(a.batches(3000))
    assert [len(d) for d, _, _ in batched] == [3000] * 6 + [2000]
    for k in range(3):
        np.testing.assert_array_equal(np.concatenate([bt[k] for bt in batched]), whole[k])
    other = syn.CriteoSynthetic(20000, seed=6).read(0, 20000)
    assert not np.array_equal(other[1], whole[1])
    dense, ids, labels = whole
    assert dense.shape == (20000, 13) and dense.dtype == np.float32 and (dense >= 0).all()
    assert ids.shape == (20000, 26) and ids.dtype == np.int64
    assert labels.dtype == np.float32 and set(np.unique(labels)) == {0.0, 1.0}


@pytest.mark.parametrize('parts', [1, 2, 3, 7])
def test_parts_are_disjoint_and_cover_the_samples(parts):
    n = 10007
    whole = syn.CriteoSynthetic(n, seed=1).read(0, n)
    got = []
    for p in range(parts):
        d = syn.CriteoSynthetic(n, seed=1, num_parts=parts, part_index=p)
        assert (d.begin, d.end) == pskv.data.partition_range(n, parts, p)
        assert len(d) == d.end - d.begin
        got.append([np.concatenate(x) for x in zip(*d.batches(1000))])
    for k in range(3):
        np.testing.assert_array_equal(np.concatenate([g[k] for g in got]), whole[k])
    with pytest.raises(pskv.InvalidArgument):
        syn.CriteoSynthetic(n, num_parts=parts, part_index=parts)


def test_ids_follow_a_zipf_law_per_feature_and_are_distinct_across_features():
    s = 1.05
    d = syn.CriteoSynthetic(200000, seed=2, zipf=s)
    _, ids, _ = d.read(0, 200000)
    f = 2  # 10 M ids
    rank_of = {int(i): r for r, i in enumerate(d.ids_of(f, np.arange(5000)))}
    counts = np.bincount([rank_of.get(int(i), 5000) for i in ids[:, f]], minlength=5001)[:5000]
    # Log-frequency against log-rank over ranks 10..1000 has slope -s (least squares).
    r = np.arange(10, 1000)
    slope = np.polyfit(np.log(r + 1.0), np.log(np.maximum(counts[r], 1)), 1)[0]
    assert abs(slope + s) < 0.1, slope
    assert counts[0] > counts[1] > counts[10] > counts[100]
    # Small vocabularies are used whole, large ones spread: distinct ids per feature.
    assert len(np.unique(ids[:, 8])) == 3  # vocabulary 3
    assert len(np.unique(ids[:, 2])) > 20000
    # No id is shared between two features.
    per_feature = [set(np.unique(ids[:, k]).tolist()) for k in range(26)]
    assert sum(len(x) for x in per_feature) == len(set().union(*per_feature))


def test_the_label_is_learnable_by_the_hidden_model():
    """The hidden model's probabilities rank the labels with AUC near 0.80 (the best a
    model can do), the click rate is near Criteo's, and both are stable across seeds."""
    for seed in (0, 1, 2):
        _, _, labels, p = syn.CriteoSynthetic(100000, seed=seed).read(0, 100000, with_probability=True)
        auc = syn.roc_auc(labels, p)
        ctr = float(labels.mean())
        assert 0.77 < auc < 0.84, (seed, auc)
        assert 0.18 < ctr < 0.32, (seed, ctr)
        assert abs(float(p.mean()) - ctr) < 0.01
    # roc_auc itself: perfect, reversed and tied scores.
    assert syn.roc_auc([0, 0, 1, 1], [0.1, 0.2, 0.3, 0.4]) == 1.0
    assert syn.roc_auc([0, 0, 1, 1], [0.4, 0.3, 0.2, 0.1]) == 0.0
    assert syn.roc_auc([0, 1], [0.5, 0.5]) == 0.5


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        syn.CriteoSynthetic(-1)
    with pytest.raises(ValueError):
        syn.CriteoSynthetic(10, zipf=0)
    with pytest.raises(ValueError):
        syn.CriteoSynthetic(10).read(5, 11)
    with pytest.raises(ValueError):
        next(syn.CriteoSynthetic(10).batches(0))
