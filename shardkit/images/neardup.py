"""Near-duplicate images: exact sub-quadratic search of all pHash pairs within a Hamming distance
(field case 24: near-duplicates on both sides of a split).

- :func:`phash64`, :func:`thumbnail32`, :func:`degenerate_reason` - the hash and the
  degenerate-image test, defined in :mod:`shardkit.images.phash` and part of this module's API
  (the packer and the doctor use the two together);
- :func:`near_pairs` - every pair of hashes within ``threshold`` bits, by multi-index hashing
  (Norouzi, Punjani & Fleet, "Fast Search in Hamming Space with Multi-Index Hashing", CVPR 2012),
  exact: no pair missed, none made up (each candidate is verified with a popcount).
- :func:`clusters` - connected components of the pair graph (scipy.sparse.csgraph).

Pure functions of numpy arrays: no I/O, no global state beyond small caches of filter weights.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from itertools import combinations

import numpy as np

from shardkit.errors import ConfigError
from shardkit.images.phash import (FLAT_FRACTION, FLAT_LEVELS, MIN_SIDE, degenerate_reason,
                                   phash64, thumbnail32)
from shardkit.validate import check_int

__all__ = ["PHASH_THRESHOLD", "MIN_SIDE", "FLAT_LEVELS", "FLAT_FRACTION", "phash64",
           "thumbnail32", "degenerate_reason", "near_pairs", "plan_blocks", "clusters"]

log = logging.getLogger("shardkit.neardup")

PHASH_THRESHOLD = 4
"""Default max Hamming distance (of 64 bits) between pHashes of near-duplicates: a resized or
re-encoded copy of a photo lands at 0-2 bits, two unrelated photos differ in ~32 on average."""

_TABLE_BITS = 22  # blocks up to this width use a dense bucket table, wider ones searchsorted
_CHUNK = 1 << 21  # candidate pairs (and probes) handled at once: bounds the working memory
_MAX_FLIPS = 1 << 16  # bit-flip patterns per block beyond which a layout is not considered


def _hash_array(hashes) -> np.ndarray:
    h = np.asarray(hashes)
    if h.ndim != 1:
        raise ConfigError(f"near_pairs needs a 1-D array of 64-bit hashes; got shape {h.shape}")
    if h.size == 0:
        return np.zeros(0, np.uint64)
    if h.dtype.kind == "u":
        return h.astype(np.uint64, copy=False)
    if h.dtype.kind == "i":  # two's complement bit patterns, e.g. hashes stored as int64
        return h.astype(np.int64, copy=False).view(np.uint64)
    raise ConfigError(f"near_pairs needs an integer array of 64-bit hashes (uint64); got "
                      f"dtype {h.dtype}")


def _threshold(threshold) -> int:
    return check_int("threshold", threshold, 0, 64, message="near-duplicate threshold must be a "
                     "Hamming distance, an int in 0-64; got {value!r}")


def _layout(m: int, t: int) -> list[tuple[int, int, int]]:
    """``m`` blocks of 64 bits as ``(shift, bits, radius)``: sizes as equal as possible, radius
    ``r`` for the first ``a + 1`` blocks and ``r - 1`` for the rest, where ``t = m r + a``."""
    q, rem = divmod(64, m)
    r, a = divmod(t, m)
    blocks, shift = [], 0
    for k in range(m):
        bits = q + (k < rem)
        blocks.append((shift, bits, r if k <= a else r - 1))
        shift += bits
    return blocks


def _num_flips(bits: int, rho: int) -> int:
    return sum(math.comb(bits, e) for e in range(1, rho + 1))


def _cost(n: int, blocks: list[tuple[int, int, int]]) -> float:
    """Expected work of multi-index hashing on ``n`` uniform random hashes: bucket probes plus
    candidate pairs to verify (each in units of one vectorised element operation)."""
    pairs = n * (n - 1) / 2
    cost = 0.0
    for _, bits, rho in blocks:
        if rho < 0:
            continue
        flips = _num_flips(bits, rho)
        if flips > _MAX_FLIPS:
            return math.inf
        probe = 1.0 if bits <= _TABLE_BITS else 3.0  # dense table vs searchsorted
        cost += n * (1 + flips / 2) * probe + pairs * (1 + flips) / 2.0 ** bits
    return cost


def plan_blocks(n: int, threshold: int) -> int:
    """The number of blocks ``m`` :func:`near_pairs` uses for ``n`` hashes at ``threshold``: the
    ``m`` in ``1..threshold + 1`` of least :func:`_cost`, or 0 (all pairs, in blocks) when that
    is cheaper (tiny ``n`` or large thresholds).

    The cost model: block ``k`` of ``b_k`` bits searched within radius ``rho_k`` costs ``n (1 +
    F_k / 2)`` probes (``F_k = sum_{e=1..rho_k} C(b_k, e)`` bit flips, each bucket pair probed
    from one side) plus ``C(n, 2) (1 + F_k) / 2**b_k`` candidate pairs (uniform hashes). Examples:
    n = 1,000,000, t = 4: m = 3 (22/21/21 bits, radii 1/1/0: ~25 M probes, ~8 M candidates,
    against 5e11 pairs); n = 20,000, t = 4: m = 5 (13/13/13/13/12 bits, radius 0). Real pHashes
    are not uniform (more candidates than modelled), which costs time, never exactness.
    """
    t = _threshold(threshold)
    best, best_cost = 0, n * (n - 1) / 2 * 0.5  # brute force: cheap contiguous XOR + popcount
    for m in range(1, min(t + 1, 64) + 1):
        c = _cost(n, _layout(m, t))
        if c < best_cost:
            best, best_cost = m, c
    return best


def _flips(bits: int, rho: int) -> np.ndarray:
    return np.array([sum(1 << b for b in combo) for e in range(1, rho + 1)
                     for combo in combinations(range(bits), e)], dtype=np.uint64)


def _expand(src: np.ndarray, start: np.ndarray, count: np.ndarray
            ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Pairs ``(src[k], start[k] + o)`` for ``o < count[k]``, in batches of <= _CHUNK pairs."""
    big = count > _CHUNK
    if big.any():  # split huge ranges (a bucket of many equal values) into _CHUNK pieces
        pieces = [(s, st + o, min(_CHUNK, c - o)) for s, st, c in
                  zip(src[big], start[big], count[big]) for o in range(0, int(c), _CHUNK)]
        extra = np.array(pieces, dtype=np.int64).reshape(-1, 3)
        src = np.concatenate([src[~big], extra[:, 0]])
        start = np.concatenate([start[~big], extra[:, 1]])
        count = np.concatenate([count[~big], extra[:, 2]])
    ends = np.cumsum(count)
    k0 = 0
    while k0 < len(count):
        base = ends[k0 - 1] if k0 else 0
        k1 = max(k0 + 1, int(np.searchsorted(ends, base + _CHUNK, side="right")))
        c = count[k0:k1]
        total = int(c.sum())
        if total:
            offs = np.arange(total) - np.repeat(np.cumsum(c) - c, c)
            yield np.repeat(src[k0:k1], c), np.repeat(start[k0:k1], c) + offs
        k0 = k1


def _sort_values(v: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """``(order, v[order])``: one int64 sort of ``value << k | position`` when it fits in 63
    bits (SIMD sort, several times faster than ``argsort``), else ``argsort``."""
    n = v.size
    k = max(1, (n - 1).bit_length())
    if bits + k > 63:
        order = np.argsort(v)
        return order, v[order]
    key = np.sort(((v << np.uint64(k)) | np.arange(n, dtype=np.uint64)).view(np.int64))
    key = key.view(np.uint64)
    return (key & np.uint64((1 << k) - 1)).astype(np.int64), key >> np.uint64(k)


def _cross(starts: np.ndarray, counts: np.ndarray, ia: np.ndarray, ib: np.ndarray
           ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Sorted positions of every member of bucket ``ia[k]`` paired with every member of
    ``ib[k]``."""
    ca, cb = counts[ia], counts[ib]
    single = (ca == 1) & (cb == 1)  # the common case: one pair, no expansion
    if single.any():
        yield starts[ia[single]], starts[ib[single]]
    if single.all():
        return
    ia, ib, ca = ia[~single], ib[~single], ca[~single]
    total = int(ca.sum())
    rep = np.repeat(np.arange(ia.size), ca)
    src = np.repeat(starts[ia], ca) + np.arange(total) - np.repeat(np.cumsum(ca) - ca, ca)
    yield from _expand(src, starts[ib][rep], counts[ib][rep])


def _block_candidates(sv: np.ndarray, bits: int, rho: int
                      ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Candidate pairs ``(a, b)`` of positions in the sorted block values ``sv`` (unordered,
    a != b) that differ in at most ``rho`` bits, each such pair exactly once: pairs inside a
    bucket of equal values, then, for each bit-flip pattern ``f`` (1..rho bits), the buckets of
    ``u`` and ``u ^ f``, probed from the bucket whose value has the top bit of ``f`` clear."""
    n = sv.size
    starts = np.flatnonzero(np.r_[True, sv[1:] != sv[:-1]])
    counts = np.diff(np.r_[starts, n])
    pos = np.arange(n)
    later = np.repeat(starts + counts, counts) - pos - 1  # equal values after each position
    inside = later > 0
    yield from _expand(pos[inside], pos[inside] + 1, later[inside])
    if rho < 1:
        return
    uniq = sv[starts]
    dense = bits <= _TABLE_BITS
    if dense:  # value -> bucket number + 1 (0: no bucket)
        uniq = uniq.astype(np.int64)
        table = np.zeros(1 << bits, np.int32 if uniq.size < 2**31 - 1 else np.int64)
        table[uniq] = np.arange(1, uniq.size + 1)
    by_top: dict[int, list[int]] = {}
    for f in _flips(bits, rho).tolist():
        by_top.setdefault(f.bit_length() - 1, []).append(f)
    for u0 in range(0, uniq.size, _CHUNK):
        chunk = uniq[u0:u0 + _CHUNK]
        for top, flips in by_top.items():
            elig = np.flatnonzero((chunk & uniq.dtype.type(1 << top)) == 0)
            src = chunk[elig]
            elig += u0
            for f in flips:
                probe = src ^ uniq.dtype.type(f)
                if dense:
                    found = table[probe]
                    hit = np.flatnonzero(found)
                    ib = found[hit].astype(np.int64) - 1
                else:
                    k = np.minimum(np.searchsorted(uniq, probe), uniq.size - 1)
                    hit = np.flatnonzero(uniq[k] == probe)
                    ib = k[hit]
                yield from _cross(starts, counts, elig[hit], ib)


def _brute(h: np.ndarray, t: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    n = h.size
    step = max(1, _CHUNK // max(n, 1))
    for s in range(0, n - 1, step):
        e = min(n - 1, s + step)
        d = np.bitwise_count(h[s:e, None] ^ h[None, s + 1:])
        r, c = np.nonzero((d <= t) & (np.arange(s + 1, n)[None, :] > np.arange(s, e)[:, None]))
        yield r + s, c + s + 1


def near_pairs(hashes: np.ndarray, threshold: int = PHASH_THRESHOLD, *,
               blocks: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every pair of hashes within ``threshold`` bits: exact and sub-quadratic.

    Multi-index hashing (Norouzi, Punjani & Fleet, CVPR 2012): the 64 bits are cut into ``m``
    blocks (:func:`plan_blocks`). Write ``t = m r + a`` (``0 <= a < m``); if every one of the first
    ``a + 1`` blocks differed in more than ``r`` bits and every other block in more than ``r - 1``,
    the distance would be at least ``(a + 1)(r + 1) + (m - a - 1) r = t + 1``. So two hashes
    within ``t`` bits agree within radius ``r`` on one of the first ``a + 1`` blocks, or within
    ``r - 1`` on another. For each block the block values are sorted; a position's bucket
    (equal block value) and the buckets of its block value with 1..radius bits flipped (a dense
    table for blocks up to 22 bits, ``searchsorted`` above) give the candidates, which are
    verified with a popcount of the full XOR (``np.bitwise_count``). A pair is kept only by the
    first block within whose radius it falls, so it comes out exactly once; every pair within
    ``t`` falls within some block's radius, so none is missed. Candidates are handled in
    batches of ~2 M pairs: memory is O(n + batch + output).

    Args:
        hashes: ``(n,)`` integer array of 64-bit hashes (uint64; signed ints are taken as their
            two's complement bit patterns).
        threshold: max Hamming distance, an int in 0-64 (default :data:`PHASH_THRESHOLD`).
        blocks: force the number of blocks ``m`` (1..threshold + 1), or 0 for all pairs in
            blocks of rows (a reference, quadratic); default: :func:`plan_blocks`.

    Returns:
        ``(i, j, distance)``: three ``(k,)`` int64 arrays, ``i < j`` positions in ``hashes`` and
        their Hamming distance (0..threshold), sorted by ``(i, j)``.

    Raises:
        ConfigError: ``hashes`` is not a 1-D integer array, ``threshold`` is not an int in 0-64,
            or ``blocks`` is out of range.
    """
    h = _hash_array(hashes)
    t = _threshold(threshold)
    n = h.size
    if blocks is None:
        m = plan_blocks(n, t) if n > 1 else 0
    else:
        m = check_int("blocks", blocks, 0, min(t + 1, 64), message=f"blocks must be 0 (all pairs) "
                      f"or a number of blocks in 1..{t + 1}; got {{value!r}}")
        if m and _cost(n, _layout(m, t)) == math.inf:
            raise ConfigError(f"blocks={m} at threshold {t} needs over {_MAX_FLIPS} bit-flip "
                              "probes per block; use more blocks")
    out_i, out_j, out_d = [], [], []

    def keep(a: np.ndarray, b: np.ndarray, hs: np.ndarray, order: np.ndarray | None,
             earlier: list[tuple[int, int, int]]) -> None:
        x = hs[a] ^ hs[b]
        d = np.bitwise_count(x)
        sel = np.flatnonzero(d <= t)
        x = x[sel]
        for shift, bits, rho in earlier:  # drop the pairs an earlier block yields
            if rho >= 0:
                later = np.bitwise_count((x >> np.uint64(shift)) & np.uint64((1 << bits) - 1)) > rho
                sel, x = sel[later], x[later]
        a, b = a[sel], b[sel]
        if order is not None:
            a, b = order[a], order[b]
        out_i.append(np.minimum(a, b))
        out_j.append(np.maximum(a, b))
        out_d.append(d[sel].astype(np.int64))

    if n > 1 and m == 0:
        for a, b in _brute(h, t):
            keep(a, b, h, None, [])
    elif n > 1:
        layout = _layout(m, t)
        log.debug("near_pairs: n=%d, t=%d, blocks %s", n, t, layout)
        for k, (shift, bits, rho) in enumerate(layout):
            if rho < 0:
                continue
            v = (h >> np.uint64(shift)) & np.uint64((1 << bits) - 1) if bits < 64 else h
            order, sv = _sort_values(v, bits)
            hs = h[order]  # verify in sorted order: bucket members are neighbours in memory
            for a, b in _block_candidates(sv, bits, rho):
                keep(a, b, hs, order, layout[:k])
    if not out_i:
        empty = np.zeros(0, np.int64)
        return empty, empty.copy(), empty.copy()
    i, j, d = (np.concatenate(x).astype(np.int64, copy=False) for x in (out_i, out_j, out_d))
    order = np.argsort(i * n + j, kind="stable")
    return i[order], j[order], d[order]


def clusters(n: int, i: np.ndarray, j: np.ndarray) -> list[list[int]]:
    """Connected components, with at least 2 members, of the graph of ``n`` nodes and the edges
    ``(i[k], j[k])`` (``scipy.sparse.csgraph.connected_components``, undirected).

    Args:
        n: number of nodes (positions ``0..n-1``).
        i, j: ``(k,)`` integer arrays of edge ends (e.g. from :func:`near_pairs`).

    Returns:
        The components as sorted lists of positions, the list sorted by first member.

    Raises:
        ConfigError: ``n`` is negative, ``i`` and ``j`` are not 1-D integer arrays of one length,
            or an edge end is outside ``[0, n)``.
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n = check_int("n", n, 0, message="clusters needs a node count n >= 0; got {value!r}")
    i, j = np.asarray(i), np.asarray(j)
    if i.ndim != 1 or j.ndim != 1 or i.shape != j.shape or (
            i.size and (i.dtype.kind not in "iu" or j.dtype.kind not in "iu")):
        raise ConfigError(f"clusters needs two 1-D integer arrays of one length; got {i.dtype} "
                          f"{i.shape} and {j.dtype} {j.shape}")
    if i.size == 0:
        return []
    lo, hi = min(i.min(), j.min()), max(i.max(), j.max())
    if lo < 0 or hi >= n:
        raise ConfigError(f"clusters: an edge end is outside [0, {n}): min {lo}, max {hi}")
    nodes, inv = np.unique(np.concatenate([i, j]).astype(np.int64), return_inverse=True)
    k = i.size
    graph = coo_matrix((np.ones(k, np.int8), (inv[:k], inv[k:])), shape=(nodes.size,) * 2)
    _, labels = connected_components(graph, directed=False)
    order = np.argsort(labels, kind="stable")  # nodes are sorted: members come out sorted
    bounds = np.flatnonzero(np.diff(labels[order])) + 1
    groups = [nodes[g].tolist() for g in np.split(order, bounds) if g.size >= 2]
    return sorted(groups, key=lambda g: g[0])
