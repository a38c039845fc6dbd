"""shardkit.packer.assign: group-atomic, dedup-aware, stratified split assignment (field case 24)."""
from __future__ import annotations

import csv
from collections import Counter, defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardkit.errors import SplitError
from shardkit.packer.assign import DEFAULT_TOLERANCE, SplitSample, assign_splits, parse_split_spec
from shardkit.packer.given import given_splits

R3 = {"train": 0.7, "val": 0.15, "test": 0.15}


# ---------------------------------------------------------------- parse_split_spec
def test_parse_split_spec_three_and_one():
    assert parse_split_spec("train=0.8,val=0.1,test=0.1") == {"train": 0.8, "val": 0.1, "test": 0.1}
    assert parse_split_spec(" train = 1.0 ") == {"train": 1.0}
    assert list(parse_split_spec("b_2=0.5,A1=0.5")) == ["b_2", "A1"]


@pytest.mark.parametrize("spec, words", [
    ("train=0.8,val=0.1", "sum to 0.9"),
    ("train=0.8,val=0.3,test=-0.1", "expected a number > 0"),
    ("train=0.5,train=0.5", "appears twice"),
    ("tr-ain=1.0", "'tr-ain' is invalid"),
    ("train:0.8,val=0.2", "not 'name=ratio'"),
    ("train=abc", "'abc'"),
    ("train=0,val=1", "expected a number > 0"),
    ("", "empty"),
])
def test_parse_split_spec_rejects(spec, words):
    with pytest.raises(SplitError) as err:
        parse_split_spec(spec)
    assert words in str(err.value)
    if spec:
        assert repr(spec) in str(err.value)


# ---------------------------------------------------------------- case 24 repro
def _case24_samples():
    """Groups [50, 30, 10, 5, 5]; 3 byte-identical copies of one image, one in another class."""
    samples = []
    for g, size in zip("ABCDE", [50, 30, 10, 5, 5]):
        for i in range(size):
            samples.append(SplitSample(f"subj{g}", "cat" if i % 2 else "dog", f"{g}{i:04d}"))
    # copies of subjC's image 3 (label "cat") under groups D, E and a new group, one labelled "dog"
    samples.append(SplitSample("subjD", "cat", "C0003"))
    samples.append(SplitSample("subjE", "dog", "C0003"))
    samples.append(SplitSample("subjF", "cat", "C0003"))
    return samples


def test_case24_groups_and_duplicates_join_and_conflict_reported():
    samples = _case24_samples()
    plan = assign_splits(samples, R3, seed=0, method="balanced")
    # identical bytes pulled C, D, E and F into one atomic set
    assert plan.merged_groups == [["subjC", "subjD", "subjE", "subjF"]]
    assert plan.num_duplicates == 3
    assert len(plan.label_conflicts) == 1
    conflict = plan.label_conflicts[0]
    assert conflict.sha256 == "C0003" and conflict.labels == ("cat", "dog")
    assert conflict.indices == (83, 100, 101, 102)
    # zero group overlap and zero hash overlap
    _assert_atomic(samples, plan)
    # only three atomic sets remain (50, 30, 23): one split must stay empty, and the plan says so
    assert plan.counts == {"train": 80, "val": 23, "test": 0}
    assert "'test' is empty" in plan.warnings[-1]
    assert "'train' got 80 of 103 samples (0.777)" in plan.warnings[0]


def test_case24_without_copies_gives_80_10_10_and_warns():
    samples = [SplitSample(f"subj{g}", "x", f"{g}{i}")
               for g, size in zip("ABCDE", [50, 30, 10, 5, 5]) for i in range(size)]
    plan = assign_splits(samples, R3, seed=0, method="balanced")
    assert plan.counts == {"train": 80, "val": 10, "test": 10}
    assert plan.achieved == {"train": 0.8, "val": 0.1, "test": 0.1}
    assert plan.group_to_split == {"subjA": "train", "subjB": "train", "subjC": "val",
                                   "subjD": "test", "subjE": "test"}
    assert len(plan.warnings) == 3
    assert "'train' got 80 of 100 samples" in plan.warnings[0]
    assert "+0.100" in plan.warnings[0] and "infeasible" in plan.warnings[0]
    assert Counter(plan.group_to_split.values()) == {"train": 2, "val": 1, "test": 2}
    # a loose enough tolerance silences the warning
    assert assign_splits(samples, R3, seed=0, tolerance=0.11, method="balanced").warnings == []


def test_within_tolerance_when_groups_are_small():
    samples = [SplitSample(f"g{i // 3}", i % 4, f"h{i}") for i in range(600)]
    plan = assign_splits(samples, R3, seed=5, method="balanced")
    assert plan.warnings == []
    for name, r in R3.items():
        assert abs(plan.achieved[name] - r) <= DEFAULT_TOLERANCE
        for c in range(4):  # stratified: each class split close to the ratios
            assert abs(plan.class_achieved[name][c] - r) <= 0.03


def test_stratification_beats_class_blind_split():
    # 40 groups of 5: classes are per group (a photographer shoots one class); rare class 'r'
    samples = []
    for g in range(40):
        label = "r" if g < 8 else "c"
        samples += [SplitSample(f"g{g}", label, f"{g}-{i}") for i in range(5)]
    plan = assign_splits(samples, {"train": 0.5, "test": 0.5}, seed=1, method="balanced")
    assert plan.class_counts["train"]["r"] == 20 and plan.class_counts["test"]["r"] == 20
    assert plan.counts == {"train": 100, "test": 100}


def test_single_split_and_determinism():
    samples = [SplitSample(f"g{i % 7}", i % 3, f"h{i}") for i in range(50)]
    one = assign_splits(samples, {"train": 1.0}, seed=3)
    assert set(one.assignment) == {"train"} and one.counts == {"train": 50}
    a = assign_splits(samples, R3, seed=3)
    b = assign_splits(samples, R3, seed=3)
    assert a.assignment == b.assignment and a.group_to_split == b.group_to_split
    # equal-sized groups: another seed gives another (still valid) plan
    plans = {tuple(assign_splits(samples, R3, seed=s).assignment) for s in range(6)}
    assert len(plans) > 1


def test_rejects_bad_inputs():
    with pytest.raises(SplitError, match="tolerance 1.5"):
        assign_splits([("g", 0, "h")], R3, seed=0, tolerance=1.5)
    with pytest.raises(SplitError, match="sample 1 is 42"):
        assign_splits([("g", 0, "h"), 42], R3, seed=0)
    with pytest.raises(SplitError, match="unknown split 'dev'"):
        assign_splits([("g", 0, "h")], R3, seed=0).indices("dev")


def _flowers_samples(flowers_dir):
    with open(flowers_dir / "metadata.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return [SplitSample(r["group_flickr_user"], r["label"], r["sha256"]) for r in rows]


def test_flowers_metadata_split_balanced(flowers_dir):
    """The real flowers groups (791 photographers, largest 54) meet 80/10/10 within tolerance."""
    samples = _flowers_samples(flowers_dir)
    plan = assign_splits(samples, {"train": 0.8, "val": 0.1, "test": 0.1}, seed=0,
                         method="balanced")
    assert len(samples) == 1839
    assert plan.warnings == []
    _assert_atomic(samples, plan)
    assert len(plan.group_to_split) == len({s.group for s in samples})
    for name in ("train", "val", "test"):
        for label, frac in plan.class_achieved[name].items():
            assert abs(frac - plan.ratios[name]) < 0.05, (name, label, frac)


def test_flowers_metadata_split_hash_misses_ratios_by_chance_and_says_why(flowers_dir):
    """The hash rule on the same groups: atomic, but the skewed group sizes (largest 54) make
    the fractions land by chance (seed 0: 0.849 / 0.083 / 0.067), and the plan says so."""
    samples = _flowers_samples(flowers_dir)
    plan = assign_splits(samples, {"train": 0.8, "val": 0.1, "test": 0.1}, seed=0)
    _assert_atomic(samples, plan)
    assert plan.method == "hash"
    assert plan.counts == {"train": 1562, "val": 153, "test": 124}
    assert [w.split()[1] for w in plan.warnings] == ["'train'", "'test'"]  # val: 0.083
    assert all("keyed hash" in w and "--split-method balanced" in w for w in plan.warnings)


# ---------------------------------------------------------------- properties
def _assert_atomic(samples, plan):
    assert len(plan.assignment) == len(samples)
    where_group, where_sha = defaultdict(set), defaultdict(set)
    for s, split in zip(samples, plan.assignment):
        where_group[s.group].add(split)
        where_sha[s.sha256].add(split)
    assert all(len(v) == 1 for v in where_group.values())
    assert all(len(v) == 1 for v in where_sha.values())
    assert Counter(plan.assignment) == Counter({k: v for k, v in plan.counts.items() if v})
    for s, split in zip(samples, plan.assignment):
        assert plan.group_to_split[s.group] == split


_sample = st.builds(SplitSample, group=st.sampled_from([f"g{i}" for i in range(12)]),
                    label=st.integers(0, 3), sha256=st.sampled_from([f"h{i}" for i in range(40)]))
_ratios = st.sampled_from([{"train": 1.0}, {"a": 0.5, "b": 0.5}, R3,
                           {"train": 0.8, "val": 0.1, "test": 0.1}])


@settings(max_examples=150, deadline=None)
@given(samples=st.lists(_sample, max_size=80), ratios=_ratios, seed=st.integers(0, 2**31),
       method=st.sampled_from(["hash", "balanced"]))
def test_property_atomic_and_complete(samples, ratios, seed, method):
    plan = assign_splits(samples, ratios, seed=seed, method=method)
    _assert_atomic(samples, plan)
    assert sum(plan.counts.values()) == len(samples)
    assert plan.num_duplicates == len(samples) - len({s.sha256 for s in samples})
    for conflict in plan.label_conflicts:
        assert len({samples[i].label for i in conflict.indices}) == len(conflict.labels) > 1
    assert plan.assignment == assign_splits(samples, ratios, seed=seed, method=method).assignment


# ---------------------------------------------------------------- given splits
def _given_case():
    """7 samples: u1 in train and val, bytes 'h1' in train and test, 'h9' twice in train."""
    samples = [SplitSample("u1", "cat", "h1"), SplitSample("u2", "dog", "h2"),
               SplitSample("u1", "cat", "h3"), SplitSample("u3", "dog", "h1"),
               SplitSample("u4", "cat", "h9"), SplitSample("u5", "cat", "h9"),
               SplitSample("u6", "dog", "h6")]
    splits = ["train", "train", "val", "test", "train", "train", "val"]
    paths = [f"{s}/{x.label}/{k}.jpg" for k, (s, x) in enumerate(zip(splits, samples))]
    return samples, splits, paths


def test_given_splits_keep_every_sample_and_report_leaks():
    samples, splits, paths = _given_case()
    plan = given_splits(samples, splits, names=["train", "val", "test", "extra"], paths=paths)
    assert plan.mode == "given" and plan.assignment == splits
    assert plan.names == ("train", "val", "test", "extra")
    assert plan.counts == {"train": 4, "val": 2, "test": 1, "extra": 0}
    assert plan.class_counts == {"train": {"cat": 3, "dog": 1}, "val": {"cat": 1, "dog": 1},
                                 "test": {"cat": 0, "dog": 1}, "extra": {"cat": 0, "dog": 0}}
    assert plan.achieved == plan.ratios == {"train": 4 / 7, "val": 2 / 7, "test": 1 / 7,
                                            "extra": 0.0}
    assert plan.class_achieved["train"] == {"cat": 0.75, "dog": 1 / 3}
    assert plan.tolerance == 0.0 and plan.merged_groups == [] and plan.num_duplicates == 2
    assert plan.shared_groups == [{"group": "u1", "splits": {"train": 1, "val": 1}}]
    assert plan.shared_bytes == [{"sha256": "h1", "indices": [0, 3],
                                  "splits": {"train": 1, "test": 1}}]
    # groups in one split keep their split; the shared one is listed instead
    assert plan.group_to_split == {"u2": "train", "u3": "test", "u4": "train", "u5": "train",
                                   "u6": "val"}
    assert plan.label_conflicts[0].sha256 == "h1" and plan.label_conflicts[0].indices == (0, 3)
    note = "left where they are (the splits are given; `shardkit check` fails on them)"
    assert plan.warnings == [
        "given split 'extra' is empty: none of its files was packed",
        f"given splits share identical bytes: 1 file content(s) in more than one split, {note}: "
        "'train/cat/0.jpg' (train) = 'test/dog/3.jpg' (test)",
        f"given splits share groups: 1 group(s) with samples in more than one split, {note}: "
        "'u1' (train 1, val 1)"]


def test_given_splits_defaults_and_errors():
    samples, splits, _ = _given_case()
    plan = given_splits(samples, splits)
    assert plan.names == ("train", "val", "test")  # first-seen order
    assert "sample 0 (train) = sample 3 (test)" in plan.warnings[0]
    with pytest.raises(SplitError, match="splits has 6 entries for 7 samples"):
        given_splits(samples, splits[:6])
    with pytest.raises(SplitError, match=r"miss \['test'\]"):
        given_splits(samples, splits, names=["train", "val"])
    with pytest.raises(SplitError, match="invalid or repeated"):
        given_splits(samples, splits, names=["train", "val", "test", "train"])
    many = [SplitSample(f"g{i}", "cat", f"h{i // 2}") for i in range(14)]
    plan = given_splits(many, ["train", "val"] * 7)
    assert len(plan.shared_bytes) == 7 and plan.warnings[0].endswith("; ... and 2 more")
