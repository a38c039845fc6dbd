"""Splits that stay put when the dataset grows (docs/DESIGN.md, "Split assignment"): the hash rule,
kept placements (``fixed``, i.e. ``--split-from``), and links (near-duplicates) in
:func:`assign_splits`."""
from __future__ import annotations

import csv
from collections import Counter

import numpy as np
import pytest

from shardkit.errors import SplitError
from shardkit.packer.assign import SplitSample, assign_splits

R3 = {"train": 0.8, "val": 0.1, "test": 0.1}


@pytest.fixture(params=["sample", "full"])
def real_samples(request):
    """The real photographer groups of examples/flowers-sample (200 photos, 120 groups) and of
    the full flowers set (1,839 photos, 791 groups; skipped where ../shared/data is absent)."""
    root = request.getfixturevalue("sample_dir" if request.param == "sample" else "flowers_dir")
    return _flowers(root)


def _flowers(flowers_dir):
    with open(flowers_dir / "metadata.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return [SplitSample(r["group_flickr_user"], r["label"], r["sha256"]) for r in rows]


def _grow(samples, fractions=(0.75, 0.87, 1.0), seed=1):
    """The real groups, revealed in three stages (about 15% new groups each time)."""
    groups = sorted({s.group for s in samples})
    order = np.random.default_rng(seed).permutation(len(groups))
    stages = []
    for f in fractions:
        keep = {groups[k] for k in order[:int(round(f * len(groups)))]}
        stages.append([s for s in samples if s.group in keep])
    return stages


def _moved(before, after) -> list[str]:
    return [g for g, split in before.group_to_split.items() if after.group_to_split[g] != split]


def test_hash_rule_moves_no_group_when_the_dataset_grows_twice(real_samples):
    stages = _grow(real_samples)
    plans = [assign_splits(s, R3, seed=0) for s in stages]
    sizes = [len(p.group_to_split) for p in plans]
    assert sizes in ([90, 104, 120], [593, 688, 791])
    assert _moved(plans[0], plans[1]) == [] and _moved(plans[1], plans[2]) == []
    # the balanced rule, on the same growth, moves many old groups (the field problem)
    bal = [assign_splits(s, R3, seed=0, method="balanced") for s in stages]
    assert len(_moved(bal[0], bal[1])) > 0.1 * sizes[0]
    assert len(_moved(bal[1], bal[2])) > 0.1 * sizes[1]


def test_kept_placements_move_nothing_and_balance_the_new_groups(real_samples):
    stages = _grow(real_samples)
    first = assign_splits(stages[0], R3, seed=0, method="balanced")
    second = assign_splits(stages[1], R3, seed=0, method="balanced", fixed=first.group_to_split)
    third = assign_splits(stages[2], R3, seed=0, method="balanced", fixed=second.group_to_split)
    assert _moved(first, second) == [] and _moved(second, third) == []
    assert second.kept_groups == len(first.group_to_split)
    assert third.kept_groups == len(second.group_to_split)
    assert second.moved_groups == [] and third.moved_groups == []
    # new groups are placed by the balanced rule from the kept counts: close to the ratios
    for name, r in R3.items():
        assert abs(third.achieved[name] - r) <= 0.02, (name, third.achieved)


def test_kept_placements_ignore_groups_that_are_gone_and_check_split_names():
    samples = [SplitSample(f"g{i}", i % 2, f"h{i}") for i in range(20)]
    fixed = {"g0": "test", "g1": "val", "gone": "train"}
    plan = assign_splits(samples, R3, seed=0, fixed=fixed)
    assert plan.group_to_split["g0"] == "test" and plan.group_to_split["g1"] == "val"
    assert plan.kept_groups == 2 and "gone" not in plan.group_to_split
    with pytest.raises(SplitError, match=r"split\(s\) \['dev'\] that are not among"):
        assign_splits(samples, R3, seed=0, fixed={"g0": "dev"})


def test_links_join_groups_and_a_kept_group_moves_only_when_joined_across_splits():
    samples = [SplitSample(f"g{i}", 0, f"h{i}") for i in range(30)]
    plan = assign_splits(samples, R3, seed=0, links=[(3, 17), (17, 25)])
    assert plan.merged_groups == [["g17", "g25", "g3"]]
    assert len({plan.group_to_split[g] for g in ("g3", "g17", "g25")}) == 1
    # g3 was in val, g17 in train (with more samples): joined, they go to the held-out split;
    # a validation image never moves into training
    samples.append(SplitSample("g17", 0, "extra"))
    fixed = {"g3": "val", "g17": "train"}
    joined = assign_splits(samples, R3, seed=0, links=[(3, 17)], fixed=fixed)
    assert joined.moved_groups == [{"group": "g17", "from": "train", "to": "val"}]
    assert "'g17' train -> val" in joined.warnings[-1]
    both = assign_splits(samples, R3, seed=0, links=[(3, 17)],
                         fixed={"g3": "val", "g17": "test"})  # equal ratios: the later name
    assert both.group_to_split["g3"] == both.group_to_split["g17"] == "test"
    with pytest.raises(SplitError, match="link \\(0, 99\\)"):
        assign_splits(samples, R3, seed=0, links=[(0, 99)])


def test_hash_rule_joined_groups_go_to_the_most_held_out_of_their_own_splits():
    """Under the hash rule each group keeps the split its own hash gives; a new near-duplicate
    link between a train group and a val group puts both in val (never the val one in train)."""
    samples = [SplitSample(f"g{i}", 0, f"h{i}") for i in range(200)]
    alone = assign_splits(samples, R3, seed=0)
    train = next(i for i in range(200) if alone.group_to_split[f"g{i}"] == "train")
    val = next(i for i in range(200) if alone.group_to_split[f"g{i}"] == "val")
    linked = assign_splits(samples, R3, seed=0, links=[(train, val)])
    assert linked.group_to_split[f"g{train}"] == linked.group_to_split[f"g{val}"] == "val"
    changed = [g for g in alone.group_to_split
               if alone.group_to_split[g] != linked.group_to_split[g]]
    assert changed == [f"g{train}"]


def test_changing_a_ratio_moves_only_groups_between_the_old_and_new_boundaries():
    samples = [SplitSample(f"g{i}", i % 3, f"h{i}") for i in range(3000)]
    old = assign_splits(samples, R3, seed=7)
    new = assign_splits(samples, {"train": 0.7, "val": 0.15, "test": 0.15}, seed=7)
    moves = Counter((old.group_to_split[g], new.group_to_split[g]) for g in old.group_to_split
                    if old.group_to_split[g] != new.group_to_split[g])
    assert set(moves) == {("train", "val"), ("val", "test")}  # [0.7, 0.8) and [0.85, 0.9)
    assert abs(moves[("train", "val")] / 3000 - 0.10) < 0.02
    assert abs(moves[("val", "test")] / 3000 - 0.05) < 0.015
    # another seed reassigns everything (about as often as two random plans differ)
    other = assign_splits(samples, R3, seed=8)
    assert sum(old.assignment[i] != other.assignment[i] for i in range(3000)) > 600


def test_hash_rule_is_balanced_per_class_in_expectation():
    samples = [SplitSample(f"g{i}", i % 4, f"h{i}") for i in range(20000)]
    plan = assign_splits(samples, R3, seed=0)
    assert plan.warnings == []
    for name, r in R3.items():
        for c in range(4):
            assert abs(plan.class_achieved[name][c] - r) < 0.015, (name, c)


def test_bad_method_and_seed():
    with pytest.raises(SplitError, match="split method 'random' is unknown"):
        assign_splits([("g", 0, "h")], R3, seed=0, method="random")
    with pytest.raises(SplitError, match="seed -1 is negative"):
        assign_splits([("g", 0, "h")], R3, seed=-1)
