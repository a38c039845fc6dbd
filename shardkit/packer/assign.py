"""Group-atomic, class-stratified, dedup-aware split assignment (pure: no I/O).

Method (:func:`assign_splits`):

1. **Dedup merge.** A union-find over groups joins every two groups that hold a sample with the same
   content hash, so identical bytes always land in one split whatever their groups (field case 24:
   byte-identical copies under different names must not straddle train and test). ``links`` (pairs
   of near-duplicate samples found by :mod:`shardkit.images.neardup`) join their groups the same way. The
   merged sets are the atomic units ("components") of the split.
2. **Label conflicts.** Identical bytes under different labels are reported in
   :attr:`SplitPlan.label_conflicts`; the plan itself never drops samples. The packer turns a
   conflict into a :class:`~shardkit.errors.LabelError` unless told otherwise (see
   ``shardkit.packer.run.pack(on_label_conflict=...)``).
3. **Kept placements** (``fixed``, from a previous pack: ``shardkit pack --split-from PREV``). A
   component holding a group that the previous pack placed goes where that group was (when its
   groups were in several splits, to the most held-out of them, i.e. the one with the smallest
   ratio: a validation or test image must never move into training; the moved groups are listed
   in :attr:`SplitPlan.moved_groups`). Only components without such a group are assigned below,
   and always by the balanced rule, starting from the kept counts, so they make up for the kept
   groups' imbalance as far as they can.
4. **Assignment** of the remaining components, by ``method``:

   - ``"hash"`` (the default of ``shardkit pack``): **stable under additions.** Each group's own
     split is decided by ``u``, a keyed hash of its name (BLAKE2b, 64 bits, keyed by the seed)
     read as a fraction in [0, 1): the first split whose cumulative ratio exceeds ``u`` (in the
     order of the ratios); a component of several groups goes to the most held-out of their
     splits (the smallest ratio). Adding groups never moves an old group, for any dataset size,
     unless a new file joins it to another group by identical bytes or a near-duplicate; then it
     can only move toward a smaller (held-out) split, never into training. Each class
     is balanced in expectation only: a split's share varies by chance, with a standard deviation
     of about ``sqrt(r (1 - r) / G)`` for ``G`` equal-sized groups (0.02 for r = 0.1, G = 225), so
     small datasets can miss their ratios by more than the tolerance (reported). Changing a ratio
     moves only the groups whose ``u`` lies between an old and a new cumulative boundary (e.g.
     train 0.8 -> 0.7 of train/val/test moves the groups with u in [0.7, 0.8) from train to val and
     those in [0.8, 0.85) from val to test); changing the seed or the order of the splits
     reassigns everything. This is the "repeatable splitting" practice of hashing a stable id
     (Lakshmanan, Robinson & Munn 2020, "Machine Learning Design Patterns", ch. 6).
   - ``"balanced"``: **closest to the ratios, not stable.** Components are sorted by size
     (descending) with a seeded random tie-break, then each goes to the split that least increases
     Pearson's chi-square statistic of observed vs expected counts, summed over the per-split
     totals and the per-(split, class) cells:
   ``sum_s (n_s - r_s N)^2 / (r_s N) + sum_{s,c} (n_sc - r_s N_c)^2 / (r_s N_c)``. Largest-first
   greedy placement is Graham's LPT rule for number partitioning (Graham 1969, "Bounds on
   multiprocessing timing anomalies"); stratifying by the most-needed class follows the idea of
   iterative stratification (Sechidis, Tsoumakas & Vlahavas 2011, "On the stratification of
   multi-label data"). Ties between splits go to the larger ratio, then the earlier name.
     Adding data can move any old group (a test measured a third of them moving for 15% more
     groups), which puts yesterday's validation images into today's training set.

**Given splits** (:func:`given_splits`: split folders or a split column) keep every sample where
the source put it. The same dedup and label-conflict checks run, but nothing moves: identical
bytes and groups found in more than one split are listed (:attr:`SplitPlan.shared_bytes`,
:attr:`SplitPlan.shared_groups`) and named in the plan's warnings.

The result is deterministic for a given ``seed`` and input order. When a split's achieved sample
fraction differs from its target by more than ``tolerance`` (absolute, default
:data:`DEFAULT_TOLERANCE` = 0.02, i.e. two percentage points), the plan carries an explicit
infeasibility warning: group sizes can make a ratio unreachable (case 24: groups [50, 30, 10, 5, 5]
with 70/15/15 give at best 80/10/10).
"""
from __future__ import annotations

import hashlib
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Hashable, Iterable, Mapping

import numpy as np

from shardkit.errors import SplitError

__all__ = [
    "DEFAULT_TOLERANCE", "SPLIT_METHODS", "SPLIT_NAME_RE", "SplitSample", "LabelConflict", "SplitPlan",
    "assign_splits", "parse_split_spec", "validate_ratios", "as_sample", "dedup", "sort_key",
    "SplitCounts",
]

DEFAULT_TOLERANCE = 0.02
"""Largest accepted absolute difference between a split's achieved and requested sample fraction."""

SPLIT_METHODS = ("hash", "balanced")
"""Assignment rules of :func:`assign_splits` (see the module docstring)."""

SPLIT_NAME_RE = re.compile(r"[A-Za-z0-9_]+")
_RATIO_SUM_EPS = 1e-6


@dataclass(frozen=True)
class SplitSample:
    """One sample as the splitter sees it: ``group`` (str), ``label`` (any hashable), ``sha256``
    (hex str)."""

    group: str
    label: Hashable
    sha256: str


@dataclass(frozen=True)
class LabelConflict:
    """Identical bytes (``sha256``) carried by samples of more than one label.

    ``labels`` are the distinct labels (sorted by their ``repr``); ``indices`` are the positions of
    every sample with these bytes in the input sequence.
    """

    sha256: str
    labels: tuple
    indices: tuple[int, ...]


@dataclass
class SplitPlan:
    """The outcome of :func:`assign_splits`.

    Attributes:
        names: split names in the order of the requested ratios (given splits: as given).
        ratios: requested sample fraction per split (sums to 1; given splits: the given
            fractions, equal to ``achieved``).
        assignment: split name of every input sample, in input order.
        group_to_split: every input group -> its split name (groups are never divided; given
            splits: groups in several splits are left out and listed in ``shared_groups``).
        counts: samples per split. ``class_counts``: split -> {label: samples}.
        achieved: split -> achieved sample fraction in [0, 1].
        class_achieved: split -> {label: fraction of that class's samples in this split}.
        merged_groups: sets of >= 2 groups joined because they share identical bytes or are
            linked by ``links`` (near-duplicates) (sorted lists).
        label_conflicts: identical bytes under different labels (see :class:`LabelConflict`).
        num_duplicates: samples whose bytes already appeared earlier in the input.
        tolerance: the absolute tolerance checked (given splits: 0.0, nothing is checked);
            ``warnings``: human-readable infeasibility notes (given splits: shared bytes and
            groups, empty splits).
        mode: ``"ratios"`` (:func:`assign_splits`) or ``"given"`` (:func:`given_splits`).
        method: the assignment rule of the components not kept (:data:`SPLIT_METHODS`;
            ``"balanced"`` whenever ``fixed`` is given; given splits: ``"given"``).
        kept_groups: groups placed where ``fixed`` said (0 without ``fixed``).
        moved_groups: ``{"group", "from", "to"}`` of each group of ``fixed`` that had to move
            because new links or identical bytes joined it to a group kept in another split.
        shared_bytes: given splits only: ``{"sha256", "indices", "splits": {split: count}}`` for
            each content found in more than one split, sorted by sha256.
        shared_groups: given splits only: ``{"group", "splits": {split: count}}`` for each
            group with samples in more than one split, sorted by group.
    """

    names: tuple[str, ...]
    ratios: dict[str, float]
    seed: int
    tolerance: float
    assignment: list[str]
    group_to_split: dict[str, str]
    counts: dict[str, int]
    class_counts: dict[str, dict[Any, int]]
    achieved: dict[str, float]
    class_achieved: dict[str, dict[Any, float]]
    merged_groups: list[list[str]] = field(default_factory=list)
    label_conflicts: list[LabelConflict] = field(default_factory=list)
    num_duplicates: int = 0
    warnings: list[str] = field(default_factory=list)
    mode: str = "ratios"
    shared_bytes: list[dict] = field(default_factory=list)
    shared_groups: list[dict] = field(default_factory=list)
    method: str = "balanced"
    kept_groups: int = 0
    moved_groups: list[dict] = field(default_factory=list)

    def indices(self, split: str) -> list[int]:
        """Input positions of the samples assigned to ``split``, ascending."""
        if split not in self.counts:
            raise SplitError(f"unknown split {split!r}; expected one of {list(self.names)}")
        return [i for i, s in enumerate(self.assignment) if s == split]


def validate_ratios(ratios: Mapping[str, float]) -> dict[str, float]:
    """Checks a ``{split name: ratio}`` mapping and returns it as a plain dict (order kept).

    Names must match ``[A-Za-z0-9_]+``; every ratio must be a finite number > 0; ratios must sum
    to 1 within 1e-6. Raises :class:`~shardkit.errors.SplitError` naming the bad entry otherwise.
    """
    if not isinstance(ratios, Mapping) or not ratios:
        raise SplitError(f"split ratios must be a non-empty mapping name -> fraction, got "
                         f"{ratios!r}")
    out: dict[str, float] = {}
    for name, value in ratios.items():
        if not isinstance(name, str) or not SPLIT_NAME_RE.fullmatch(name):
            raise SplitError(f"split name {name!r} is invalid; expected letters, digits or '_'")
        try:
            ratio = float(value)
        except (TypeError, ValueError):
            raise SplitError(f"ratio of split {name!r} is {value!r}; expected a number > 0"
                             ) from None
        if not np.isfinite(ratio) or ratio <= 0:
            raise SplitError(f"ratio of split {name!r} is {value!r}; expected a number > 0")
        out[name] = ratio
    total = sum(out.values())
    if abs(total - 1.0) > _RATIO_SUM_EPS:
        raise SplitError(f"split ratios {out} sum to {total:.6g}; expected 1 (within 1e-6)")
    return out


def parse_split_spec(spec: str) -> dict[str, float]:
    """Parses ``"train=0.8,val=0.1,test=0.1"`` into ``{"train": 0.8, "val": 0.1, "test": 0.1}``.

    ``"train=1.0"`` gives a single split. Spaces around items are ignored. Raises
    :class:`~shardkit.errors.SplitError` naming ``spec`` when an item is not ``name=number``, a name
    repeats or fails ``[A-Za-z0-9_]+``, a ratio is <= 0, or the ratios do not sum to 1 within 1e-6.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise SplitError(f"split spec {spec!r} is empty; expected e.g. "
                         "'train=0.8,val=0.1,test=0.1'")
    ratios: dict[str, float] = {}
    for item in spec.split(","):
        name, sep, value = item.strip().partition("=")
        name = name.strip()
        if not sep or not name:
            raise SplitError(f"split spec {spec!r}: item {item.strip()!r} is not 'name=ratio'")
        if name in ratios:
            raise SplitError(f"split spec {spec!r}: split {name!r} appears twice")
        try:
            ratios[name] = float(value)
        except ValueError:
            raise SplitError(f"split spec {spec!r}: ratio {value.strip()!r} of {name!r} is not "
                             "a number") from None
    try:
        return validate_ratios(ratios)
    except SplitError as exc:
        raise SplitError(f"split spec {spec!r}: {exc}") from None


class _UnionFind:
    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        root = i
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[i] != root:  # path compression
            self.parent[i], i = root, self.parent[i]
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def as_sample(obj: Any, i: int) -> SplitSample:
    if isinstance(obj, SplitSample):
        return obj
    if isinstance(obj, tuple) and len(obj) == 3:
        return SplitSample(str(obj[0]), obj[1], str(obj[2]))
    try:
        return SplitSample(str(obj.group), obj.label, str(obj.sha256))
    except AttributeError:
        raise SplitError(f"sample {i} is {obj!r}; expected (group, label, sha256) or an object "
                         "with .group, .label and .sha256") from None


def sort_key(label: Any) -> tuple:
    return (type(label).__name__, label) if isinstance(label, (int, str)) else ("~", repr(label))


def dedup(items: list[SplitSample], links: Iterable[tuple[int, int]] = ()):
    """Union-find over groups joined by shared content hash or by ``links`` (pairs of sample
    positions), and the label conflicts.

    Returns ``(group_ids, union_find, by_sha, conflicts)``: group -> id (first-seen order), the
    :class:`_UnionFind` over group ids, sha256 -> input positions, :class:`LabelConflict` list.
    """
    group_ids: dict[str, int] = {}
    for s in items:
        group_ids.setdefault(s.group, len(group_ids))
    uf = _UnionFind(len(group_ids))
    first_group_of_sha: dict[str, int] = {}
    by_sha: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(items):
        gid = group_ids[s.group]
        by_sha[s.sha256].append(i)
        if s.sha256 in first_group_of_sha:
            uf.union(first_group_of_sha[s.sha256], gid)
        else:
            first_group_of_sha[s.sha256] = gid
    for a, b in links:
        if not (0 <= a < len(items) and 0 <= b < len(items)):
            raise SplitError(f"link ({a}, {b}) names a sample outside 0..{len(items) - 1}")
        uf.union(group_ids[items[a].group], group_ids[items[b].group])
    conflicts = []
    for sha, idx in by_sha.items():
        labels = {items[i].label for i in idx}
        if len(labels) > 1:
            conflicts.append(LabelConflict(sha, tuple(sorted(labels, key=sort_key)), tuple(idx)))
    return group_ids, uf, by_sha, conflicts


def assign_splits(samples: Iterable[Any], ratios: Mapping[str, float], seed: int,
                  tolerance: float = DEFAULT_TOLERANCE, *, method: str = "hash",
                  links: Iterable[tuple[int, int]] = (),
                  fixed: Mapping[str, str] | None = None) -> SplitPlan:
    """Assigns every sample to one split, group-atomically after dedup, stratified by class.

    Args:
        samples: sequence of :class:`SplitSample`, ``(group, label, sha256)`` tuples, or objects
            with ``.group``, ``.label`` and ``.sha256``. A sample with a unique group is its own
            group.
        ratios: ``{split name: fraction}``, checked by :func:`validate_ratios`.
        seed: non-negative integer: the key of the ``"hash"`` rule, the tie-break of
            ``"balanced"``.
        tolerance: largest accepted ``|achieved - requested|`` sample fraction per split, in [0, 1).
        method: ``"hash"`` (stable when the dataset grows) or ``"balanced"`` (closest to the
            ratios); see the module docstring.
        links: pairs ``(i, j)`` of sample positions that must share a split (near-duplicates).
        fixed: ``{group: split}`` placements to keep (a previous pack's); groups not among the
            samples are ignored. Every split named must be one of ``ratios``.

    Returns:
        a :class:`SplitPlan`; see the module docstring for the method. No group and no sha256 ever
        appears in two splits, and every sample is assigned exactly once.

    Raises:
        SplitError: bad ratios, bad tolerance, unknown method, a seed < 0, a link outside the
            samples, a ``fixed`` split not in ``ratios``, or a sample that is not
            (group, label, sha256).
    """
    ratios, fixed = _checked(ratios, tolerance, method, seed, fixed)
    items = [as_sample(s, i) for i, s in enumerate(samples)]
    names = tuple(ratios)
    n = len(items)

    group_ids, uf, by_sha, conflicts = dedup(items, links)
    place = _Placement(items, group_ids, uf, names, ratios)
    kept, moved = _keep_fixed(place, fixed)  # 3. kept placements
    rest = [r for r in place.roots if r not in place.split_of]  # 4. the other components
    if method == "hash" and not fixed:
        _place_by_hash(place, rest, int(seed))
    else:
        _place_balanced(place, rest, int(seed))
    n_s, n_sc, class_total = place.counts.n_s, place.counts.n_sc, place.counts.class_total

    assignment = [place.split_of[uf.find(group_ids[s.group])] for s in items]
    group_to_split = {g: place.split_of[uf.find(gid)] for g, gid in group_ids.items()}
    class_keys = sorted(class_total, key=sort_key)
    class_counts = {name: {c: n_sc[name][c] for c in class_keys} for name in names}
    achieved = {name: (n_s[name] / n if n else 0.0) for name in names}
    class_achieved = {name: {c: n_sc[name][c] / class_total[c] for c in class_keys}
                      for name in names}
    warnings = _ratio_warnings(place, achieved, tolerance, method, bool(fixed))
    if moved:
        warnings.append(f"{len(moved)} group(s) kept from the previous pack moved to another "
                        "split, because identical bytes or near-duplicates now join them to "
                        "groups kept elsewhere: " + "; ".join(
                            f"{m['group']!r} {m['from']} -> {m['to']}" for m in moved[:5])
                        + (f"; ... and {len(moved) - 5} more" if len(moved) > 5 else ""))
    return SplitPlan(names=names, ratios=ratios, seed=int(seed), tolerance=float(tolerance),
                     assignment=assignment, group_to_split=group_to_split, counts=dict(n_s),
                     class_counts=class_counts, achieved=achieved, class_achieved=class_achieved,
                     merged_groups=place.merged, label_conflicts=conflicts,
                     num_duplicates=n - len(by_sha), warnings=warnings,
                     method="balanced" if fixed else method, kept_groups=kept,
                     moved_groups=moved)


def _checked(ratios: Mapping[str, float], tolerance: float, method: str, seed: int,
             fixed: Mapping[str, str] | None) -> tuple[dict[str, float], dict[str, str]]:
    """The checked ``ratios`` and ``fixed`` (a dict) of :func:`assign_splits`; SplitError for a
    bad ratio, tolerance, method, seed or a ``fixed`` split not in ``ratios``."""
    ratios = validate_ratios(ratios)
    if not (0 <= float(tolerance) < 1):
        raise SplitError(f"split tolerance {tolerance!r} is out of range; expected 0 <= t < 1")
    if method not in SPLIT_METHODS:
        raise SplitError(f"split method {method!r} is unknown; expected one of {SPLIT_METHODS}")
    if int(seed) < 0:
        raise SplitError(f"split seed {seed!r} is negative; expected an integer >= 0")
    fixed = dict(fixed or {})
    unknown = sorted(set(fixed.values()) - set(ratios))
    if unknown:
        raise SplitError(f"kept placements name split(s) {unknown} that are not among the "
                         f"requested splits {list(ratios)}")
    return ratios, fixed


class _Placement:
    """The atomic sets of :func:`assign_splits` (union-find roots of the merged groups, with
    their sample positions and group names) and where each has gone so far (``split_of``,
    counted in ``counts``, a :class:`SplitCounts`)."""

    def __init__(self, items: list[SplitSample], group_ids: dict[str, int], uf: _UnionFind,
                 names: tuple[str, ...], ratios: dict[str, float]):
        self.items, self.names, self.ratios = items, names, ratios
        self.samples: dict[int, list[int]] = defaultdict(list)  # root -> sample positions
        for i, s in enumerate(items):
            self.samples[uf.find(group_ids[s.group])].append(i)
        self.groups: dict[int, list[str]] = defaultdict(list)  # root -> group names
        for g, gid in group_ids.items():
            self.groups[uf.find(gid)].append(g)
        self.merged = sorted(sorted(gs) for gs in self.groups.values() if len(gs) > 1)
        self.roots = sorted(self.samples)
        self.counts = SplitCounts(names, ratios, len(items), Counter(s.label for s in items))
        self.split_of: dict[int, str] = {}

    def labels(self, root: int) -> list:
        return [self.items[i].label for i in self.samples[root]]

    def put(self, root: int, split: str, labels: list | None = None) -> None:
        self.split_of[root] = split
        self.counts.add(split, self.labels(root) if labels is None else labels)


def _keep_fixed(place: _Placement, fixed: dict[str, str]) -> tuple[int, list[dict]]:
    """Step 3: each set holding a group of ``fixed`` goes where that group was (the most
    held-out of their splits when they differ). Returns ``(kept groups, moved groups)``."""
    kept, moved = 0, []
    for root in place.roots:
        placed = {fixed[g] for g in place.groups[root] if g in fixed}
        if not placed:
            continue
        split = _most_held_out(placed, place.names, place.ratios)
        for g in sorted(place.groups[root]):
            if g in fixed:
                kept += fixed[g] == split
                if fixed[g] != split:
                    moved.append({"group": g, "from": fixed[g], "to": split})
        place.put(root, split)
    return kept, moved


def _place_by_hash(place: _Placement, roots: list[int], seed: int) -> None:
    """Step 4, ``"hash"``: each group's split from its keyed hash; a set of several groups goes
    to the most held-out of their splits."""
    names = place.names
    edges = np.cumsum([place.ratios[x] for x in names])
    for root in roots:
        own = {next((x for x, edge in zip(names, edges) if _unit_hash(seed, g) < edge),
                    names[-1]) for g in place.groups[root]}
        place.put(root, _most_held_out(own, names, place.ratios))


def _place_balanced(place: _Placement, roots: list[int], seed: int) -> None:
    """Step 4, ``"balanced"`` (and after kept placements): largest set first, seeded tie-break,
    each to the split of :meth:`SplitCounts.best`."""
    tiebreak = np.random.default_rng(seed).permutation(len(roots))
    order = sorted(range(len(roots)), key=lambda k: (-len(place.samples[roots[k]]), tiebreak[k]))
    for k in order:
        labels = place.labels(roots[k])
        place.put(roots[k], place.counts.best(labels), labels)


def _ratio_warnings(place: _Placement, achieved: dict[str, float], tolerance: float,
                    method: str, fixed: bool) -> list[str]:
    """A warning per split that is empty or misses its ratio by more than ``tolerance``, saying
    why (the kept placements, the hash rule's chance, or the group sizes)."""
    n, n_s, ratios, num_sets = place.counts.n, place.counts.n_s, place.ratios, len(place.roots)
    why = ("the kept placements (--split-from) and the group sizes" if fixed else
           "each group's split is drawn from a keyed hash (stable when the dataset grows), so "
           "with few groups the fractions vary by chance; --split-method balanced meets the "
           "ratios more closely but may move groups when the dataset grows" if method == "hash"
           else "the group sizes make this ratio infeasible")
    warnings = []
    for name in place.names:
        miss = achieved[name] - ratios[name]
        if n and n_s[name] == 0:
            warnings.append(f"split {name!r} is empty: no atomic group set fell to its ratio "
                            f"{ratios[name]:.3f} ({num_sets} sets for {len(place.names)} "
                            f"splits); {why}")
        elif n and abs(miss) > tolerance:
            warnings.append(
                f"split {name!r} got {n_s[name]} of {n} samples ({achieved[name]:.3f}) but "
                f"{ratios[name]:.3f} was requested: off by {miss:+.3f}, more than the tolerance "
                f"{tolerance:g}; {why} ({num_sets} atomic group sets, the largest has "
                f"{max((len(v) for v in place.samples.values()), default=0)} samples)")
    return warnings


def _most_held_out(candidates: set[str], names: tuple[str, ...], ratios: dict[str, float]
                   ) -> str:
    """The split of ``candidates`` with the smallest ratio (ties: the later name): where an
    atomic set goes when its groups were, or hash, into several splits. Held-out splits are the
    small ones; moving a validation or test image into training would leak it, moving a
    training image out of training only costs a sample."""
    return min(candidates, key=lambda x: (ratios[x], -names.index(x)))


def _unit_hash(seed: int, key: str) -> float:
    """``key`` hashed with BLAKE2b (64-bit digest, keyed by the decimal ``seed``) as a fraction
    in [0, 1). Lone surrogates (undecodable file names) are hashed as they are."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8,
                             key=str(seed).encode("ascii")[:64]).digest()
    return int.from_bytes(digest, "big") / 2.0 ** 64


class SplitCounts:
    """Samples per split and per (split, class) while assigning; :meth:`best` is the balanced
    rule's choice (least increase of the chi-square statistic, see the module docstring)."""

    def __init__(self, names: tuple[str, ...], ratios: dict[str, float], n: int,
                 class_total: Counter):
        self.names, self.ratios, self.n, self.class_total = names, ratios, n, class_total
        self.n_s = {name: 0 for name in names}
        self.n_sc: dict[str, Counter] = {name: Counter() for name in names}
        self.order = sorted(range(len(names)), key=lambda j: (-ratios[names[j]], j))

    def add(self, split: str, labels: list) -> None:
        self.n_s[split] += len(labels)
        self.n_sc[split].update(labels)

    def best(self, labels: list) -> str:
        size, cls = len(labels), Counter(labels)
        best_name, best_delta = None, None
        for j in self.order:
            name = self.names[j]
            r = self.ratios[name]
            t = r * self.n
            delta = ((self.n_s[name] + size - t) ** 2 - (self.n_s[name] - t) ** 2) / t
            for c, cnt in cls.items():
                tc = r * self.class_total[c]
                have = self.n_sc[name][c]
                delta += ((have + cnt - tc) ** 2 - (have - tc) ** 2) / tc
            if best_delta is None or delta < best_delta - 1e-12:
                best_name, best_delta = name, delta
        return best_name
