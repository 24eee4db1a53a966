"""Synthetic click data shaped like Criteo's (issue 41 item 8), for the embedding examples.

Each sample has 13 dense features (non-negative counts, heavy-tailed as Criteo's), 26
categorical features whose values are u64 ids (as int64 bits) drawn from a Zipf law
over each feature's vocabulary (the Criteo Kaggle set's cardinalities, up to 10 M),
and a click label drawn from a hidden logistic model, so that a model can learn it::

    import pskv.synthetic
    data = pskv.synthetic.CriteoSynthetic(1_000_000, seed=0, num_parts=kv.num_workers,
                                          part_index=kv.rank)
    for dense, ids, labels in data.batches(4096):
        ...   # dense (b, 13) float32, ids (b, 26) int64, labels (b,) float32

Deterministic: sample ``i`` depends only on ``(seed, i)``, so every worker, rerun and
partitioning sees the same data, and ``num_parts``/``part_index`` split the samples as
:func:`pskv.data.partition_range` (disjoint parts that cover them).

The hidden model: ``logit = bias + sum_j a_j z_j + sum_f w_f(id_f)`` with ``z_j`` the
standardised ``log1p`` of dense count ``j`` and ``w_f(id)`` a fixed normal weight per
id (a hash of the id, scale 0.25); the bias gives a click rate near Criteo's 25 %.
The hidden model's own AUC (the best any model can reach) is about 0.80 with the
default parameters (:func:`roc_auc` of :meth:`CriteoSynthetic.read` with
``with_probability=True``; measured in ``tests/python/test_synthetic.py``); a learner
reaches less, since most tail ids are seen too rarely to learn their weights.
"""
import numpy as np

from .data import partition_range

__all__ = ['CriteoSynthetic', 'CRITEO_VOCAB_SIZES', 'roc_auc']

#: The 26 categorical features' cardinalities in the Criteo Kaggle (Display
#: Advertising Challenge) set, as counted by DLRM's preprocessing.
CRITEO_VOCAB_SIZES = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593,
                      3194, 27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105,
                      142572)

_CHUNK = 8192  # samples generated together (one random stream per chunk)
_GOLDEN = 0x9E3779B97F4A7C15


def _mix64(x):
    """MurmurHash3's 64-bit finaliser, elementwise on a uint64 array (a bijection)."""
    x = np.array(x, dtype=np.uint64, copy=True)
    with np.errstate(over='ignore'):
        x ^= x >> np.uint64(33)
        x *= np.uint64(0xFF51AFD7ED558CCD)
        x ^= x >> np.uint64(33)
        x *= np.uint64(0xC4CEB9FE1A85EC53)
        x ^= x >> np.uint64(33)
    return x


def _unit(bits):
    """Uniform floats in (0, 1) from 64-bit hashes."""
    return ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * (1.0 / (1 << 53))


def roc_auc(labels, scores):
    """The area under the ROC curve of `scores` for binary `labels` (ties count half).

    Parameters
    ----------
    labels : array_like
        0/1 labels.
    scores : array_like
        Scores of the same length; larger means more likely 1.

    Returns
    -------
    float
        The probability that a random positive scores above a random negative.
    """
    labels = np.asarray(labels).ravel() > 0.5
    scores = np.asarray(scores, dtype=np.float64).ravel()
    order = np.argsort(scores, kind='mergesort')
    s = scores[order]
    ranks = np.empty(len(s), dtype=np.float64)
    # Average ranks over ties.
    edges = np.flatnonzero(np.diff(s)) + 1
    starts = np.concatenate(([0], edges))
    ends = np.concatenate((edges, [len(s)]))
    for b, e in zip(starts, ends):
        ranks[b:e] = (b + e + 1) / 2.0
    r = np.empty(len(s), dtype=np.float64)
    r[order] = ranks
    pos = int(labels.sum())
    neg = len(labels) - pos
    if pos == 0 or neg == 0:
        raise ValueError('roc_auc needs both labels among the samples')
    return float((r[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


class CriteoSynthetic:
    """Criteo-shaped synthetic click data: 13 dense counts, 26 Zipf u64 ids, a label.

    Parameters
    ----------
    num_samples : int
        Samples in the whole data set (all parts).
    seed : int, optional
        Everything (the hidden model and the samples) is a function of the seed.
    num_parts : int, optional
        Parts (workers) the samples are split into.
    part_index : int, optional
        This part, 0 .. num_parts - 1: samples ``partition_range(num_samples, num_parts,
        part_index)``.
    zipf : float, optional
        Exponent of the Zipf law of each feature's ids (rank r drawn with probability
        about proportional to ``(r + 1) ** -zipf``).
    vocab_sizes : sequence of int, optional
        Each categorical feature's vocabulary (its number of distinct ids); default
        :data:`CRITEO_VOCAB_SIZES`. Its length is the number of categorical features.
    weight_scale : float, optional
        Standard deviation of the hidden model's weight of each id.
    """

    num_dense = 13

    def __init__(self, num_samples, seed=0, num_parts=1, part_index=0, zipf=1.05, vocab_sizes=None,
                 weight_scale=0.25):
        if num_samples < 0:
            raise ValueError('num_samples must be >= 0, got %r' % (num_samples,))
        if not zipf > 0:
            raise ValueError('zipf must be > 0, got %r' % (zipf,))
        self.num_samples = int(num_samples)
        self.seed = int(seed)
        self.zipf = float(zipf)
        self.vocab_sizes = tuple(int(v) for v in (CRITEO_VOCAB_SIZES if vocab_sizes is None else vocab_sizes))
        if not self.vocab_sizes or min(self.vocab_sizes) < 1:
            raise ValueError('vocab_sizes must be a non-empty sequence of sizes >= 1')
        self.num_sparse = len(self.vocab_sizes)
        self.begin, self.end = partition_range(self.num_samples, num_parts, part_index)
        self._salt = _mix64(np.uint64(self.seed) ^ np.uint64(0xC1EC0)) | np.uint64(1)
        self._feature_salt = _mix64((np.arange(self.num_sparse, dtype=np.uint64) + np.uint64(1)) *
                                    np.uint64(_GOLDEN))
        # The hidden model and the dense features' laws, from the seed alone.
        rng = np.random.default_rng([self.seed, 0x5EED])
        self._dense_mu = rng.uniform(0.0, 4.0, self.num_dense)
        self._dense_sd = rng.uniform(0.5, 1.5, self.num_dense)
        self._dense_w = rng.normal(0.0, 0.2, self.num_dense)
        self._weight_scale = float(weight_scale)
        self._bias = -1.45  # a click rate near 25 % with the default scales
        # The dense features' mean standardised log1p (not 0: counts are floored), so
        # the dense term is centred and the click rate does not depend on the seed.
        zs = self._standardised(np.floor(np.exp(self._dense_mu + self._dense_sd *
                                                rng.standard_normal((65536, self.num_dense)))))
        self._dense_center = zs.mean(axis=0)
        # Likewise each feature's mean id weight (its hot ids' weights dominate it).
        draws = rng.random((65536, self.num_sparse))
        self._sparse_center = sum(
            self._weights(self.ids_of(f, self._ranks(draws[:, f], v))).mean()
            for f, v in enumerate(self.vocab_sizes))

    def __len__(self):
        """Samples of this part."""
        return self.end - self.begin

    def ids_of(self, feature, ranks):
        """The u64 ids (as int64 bits) of `ranks` (0: the most frequent) of `feature`.

        Parameters
        ----------
        feature : int
            Categorical feature, 0 .. num_sparse - 1.
        ranks : array_like
            Ranks in the feature's Zipf law.

        Returns
        -------
        numpy.ndarray
            int64 ids, distinct across features and ranks.
        """
        with np.errstate(over='ignore'):
            x = np.asarray(ranks, dtype=np.uint64) * np.uint64(_GOLDEN) + self._feature_salt[feature]
        return _mix64(x).view(np.int64)

    def _standardised(self, dense):
        return (np.log1p(np.asarray(dense, np.float64)) - self._dense_mu) / self._dense_sd

    def _weights(self, ids):
        """The hidden model's weight of each id (a normal from a hash of the id)."""
        h = _mix64(ids.view(np.uint64) ^ self._salt)
        u1, u2 = _unit(h), _unit(_mix64(h))
        return self._weight_scale * np.sqrt(-2.0 * np.log(u1)) * np.cos(2 * np.pi * u2)

    def _ranks(self, u, vocab):
        """Zipf ranks in [0, vocab) by the inverse CDF of the bounded power law over
        [1, vocab + 1) (the continuous approximation of Zipf's law)."""
        s = self.zipf
        if abs(s - 1.0) < 1e-9:
            x = np.power(vocab + 1.0, u)
        else:
            top = np.power(vocab + 1.0, 1.0 - s)
            x = np.power(1.0 + u * (top - 1.0), 1.0 / (1.0 - s))
        return np.minimum(np.floor(x).astype(np.int64) - 1, vocab - 1).clip(0)

    def _chunk(self, c):
        """Samples [c * _CHUNK, (c + 1) * _CHUNK) of the whole set: dense, ids, labels, p."""
        rng = np.random.default_rng([self.seed, 1, c])
        n = _CHUNK
        z = rng.standard_normal((n, self.num_dense))
        dense = np.floor(np.exp(self._dense_mu + self._dense_sd * z)).astype(np.float32)
        u = rng.random((n, self.num_sparse))
        ids = np.empty((n, self.num_sparse), dtype=np.int64)
        logit = np.full(n, self._bias - self._sparse_center)
        for f, vocab in enumerate(self.vocab_sizes):
            ids[:, f] = self.ids_of(f, self._ranks(u[:, f], vocab))
            logit += self._weights(ids[:, f])
        logit += (self._standardised(dense) - self._dense_center) @ self._dense_w
        p = 1.0 / (1.0 + np.exp(-logit))
        labels = (rng.random(n) < p).astype(np.float32)
        return dense, ids, labels, p

    def read(self, begin, end, with_probability=False):
        """Samples [begin, end) of the whole data set (any part's).

        Parameters
        ----------
        begin, end : int
            Sample indices, 0 <= begin <= end <= num_samples.
        with_probability : bool, optional
            Also return the hidden model's click probability of each sample.

        Returns
        -------
        tuple of numpy.ndarray
            ``(dense, ids, labels)``: float32 (n, 13), int64 (n, num_sparse), float32
            (n,); with `with_probability`, a fourth float64 (n,) array.
        """
        if not 0 <= begin <= end <= self.num_samples:
            raise ValueError('read(%d, %d) outside the %d samples' % (begin, end, self.num_samples))
        parts = []
        for c in range(begin // _CHUNK, (end + _CHUNK - 1) // _CHUNK):
            lo, hi = max(begin, c * _CHUNK) - c * _CHUNK, min(end, (c + 1) * _CHUNK) - c * _CHUNK
            parts.append([a[lo:hi] for a in self._chunk(c)])
        if not parts:
            out = (np.zeros((0, self.num_dense), np.float32), np.zeros((0, self.num_sparse), np.int64),
                   np.zeros(0, np.float32), np.zeros(0))
        else:
            out = tuple(np.concatenate([p[k] for p in parts]) for k in range(4))
        return out if with_probability else out[:3]

    def batches(self, batch_size, with_probability=False):
        """This part's samples in order, `batch_size` at a time (the last batch may be smaller).

        Parameters
        ----------
        batch_size : int
            Samples per batch.
        with_probability : bool, optional
            Also yield the hidden model's click probabilities.

        Returns
        -------
        iterator of tuple
            ``(dense, ids, labels)`` (and probabilities), as :meth:`read`.
        """
        if batch_size < 1:
            raise ValueError('batch_size must be >= 1')
        for b in range(self.begin, self.end, batch_size):
            yield self.read(b, min(b + batch_size, self.end), with_probability)
