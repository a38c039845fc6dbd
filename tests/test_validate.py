"""The one integer check (shardkit.validate) and the options that go through it."""
from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest

from shardkit.errors import ConfigError
from shardkit.images.sniff import resolve_max_pixels
from shardkit.packer.options import PackOptions, parse_size
from shardkit.sharding import plan_epoch
from shardkit.stream.options import SamplingOptions
from shardkit.stream.source import dist_rank_world
from shardkit.stream.state import check_epoch
from shardkit.train.config import TrainConfig
from shardkit.transforms import TransformConfig
from shardkit.validate import check_int, is_int

INTEGERS = [0, 7, np.int64(7), np.int32(7), np.uint8(7), np.int8(-3), np.uint64(2**64 - 1),
            10**40, -(10**40)]
NOT_INTEGERS = [True, False, np.bool_(True), 2.0, 2.5, np.float64(2.0), float("nan"), "3", b"3",
                None, [3], np.array([3]), 3 + 0j]


@pytest.mark.parametrize("value", INTEGERS, ids=repr)
def test_integers_are_accepted_and_come_back_as_python_ints(value):
    assert is_int(value)
    got = check_int("n", value)
    assert type(got) is int and got == int(value)


@pytest.mark.parametrize("value", NOT_INTEGERS, ids=repr)
def test_bools_floats_and_others_are_refused_naming_the_value(value):
    assert not is_int(value)
    with pytest.raises(ConfigError) as err:
        check_int("batch_size", value, 1)
    assert str(err.value) == f"batch_size={value!r}: expected an int >= 1"


def test_the_range_is_checked_and_named():
    assert check_int("q", np.uint8(100), 1, 100) == 100
    assert check_int("q", 1, 1, 100) == 1
    for bad in (0, 101, np.int64(101), np.uint8(0)):
        with pytest.raises(ConfigError, match=r"^q=.*: expected an int in \[1, 100\]$"):
            check_int("q", bad, 1, 100)
    with pytest.raises(ConfigError, match=r"^q=-1: expected an int >= 0$"):
        check_int("q", -1, 0)
    with pytest.raises(ConfigError, match=r"^q=65: expected an int <= 64$"):
        check_int("q", 65, maximum=64)
    with pytest.raises(ConfigError, match=r"^q='a': expected an int$"):
        check_int("q", "a")


def test_huge_ints_compare_exactly():
    assert check_int("n", 10**40, 0) == 10**40
    assert check_int("n", np.uint64(2**64 - 1), 0, 2**64 - 1) == 2**64 - 1
    with pytest.raises(ConfigError, match=rf"n={2**63}: expected an int in \[0, {2**63 - 1}\]"):
        check_int("n", 2**63, 0, 2**63 - 1)
    with pytest.raises(ConfigError, match=r"n=np.uint64\(18446744073709551615\): expected"):
        check_int("n", np.uint64(2**64 - 1), 0, 2**63 - 1)


def test_optional_and_message_template():
    assert check_int("side", None, 1, optional=True) is None
    assert check_int("side", np.int16(5), 1, optional=True) == 5
    with pytest.raises(ConfigError, match=r"^side=0: expected None or an int >= 1$"):
        check_int("side", 0, 1, optional=True)
    with pytest.raises(ConfigError, match=r"^side=None: expected an int >= 1$"):
        check_int("side", None, 1)
    with pytest.raises(ConfigError, match=r"^seed=True; expected an integer >= 0 \(0\.\.None\)$"):
        check_int("seed", True, 0, message="{name}={value!r}; expected an integer >= {minimum} "
                                           "({minimum}..{maximum})")


def test_config_error_is_a_value_error():
    with pytest.raises(ValueError):
        check_int("n", 1.5)


# ----------------------------------------------------------------------------- the call sites
# Every option below refused numpy integers, or took bools, before it used check_int.

def test_numpy_integers_reach_options_as_python_ints():
    cfg = TransformConfig(image_size=np.int64(64))
    assert type(cfg.image_size) is int and cfg.image_size == 64
    opts = SamplingOptions(rank=np.int64(1), world_size=np.int32(2),
                           samples_per_epoch=np.uint16(10))
    assert (opts.rank, opts.world_size, opts.samples_per_epoch) == (1, 2, 10)
    assert {type(opts.rank), type(opts.world_size), type(opts.samples_per_epoch)} == {int}
    train = TrainConfig(data="d", out="o", batch_size=np.int64(4), seed=np.uint8(3),
                        max_steps=np.int32(5), cache_max_side=np.int64(128))
    assert json.loads(json.dumps(dataclasses.asdict(train)))["batch_size"] == 4  # plain ints
    assert (train.batch_size, train.seed, train.max_steps, train.cache_max_side) == (4, 3, 5, 128)
    assert resolve_max_pixels(np.int64(1000)) == 1000
    assert type(resolve_max_pixels(np.int64(1000))) is int
    assert check_epoch(np.uint8(3)) == 3 and type(check_epoch(np.uint8(3))) is int
    assert dist_rank_world(np.int64(1), np.int64(2)) == (1, 2)


@pytest.mark.parametrize("make, match", [
    (lambda: TransformConfig(image_size=True), r"^image_size must be a positive int, got True$"),
    (lambda: SamplingOptions(rank=True, world_size=2),
     r"^rank=True: expected None or an int >= 0$"),
    (lambda: TrainConfig(data="d", out="o", max_steps=True),
     r"^max_steps=True: expected an integer >= 1 or null$"),
    (lambda: TrainConfig(data="d", out="o", samples_per_epoch=True),
     r"^samples_per_epoch=True: expected an integer >= 1 or null$"),
    (lambda: resolve_max_pixels(np.bool_(True)),
     "^max_pixels must be a positive int, got " + re.escape(repr(np.bool_(True))) + "$"),
    (lambda: dist_rank_world(True, 2), r"^rank=True, world_size=2: expected ints"),
    (lambda: parse_size(True), r"^size True is not a size; expected e.g. 64MB"),
])
def test_bools_are_refused(make, match):
    """image_size, max_steps, samples_per_epoch, rank/world_size and sizes took True before."""
    with pytest.raises(ConfigError, match=match):
        make()


def test_pack_options_and_sharding_take_numpy_integers():
    opts = PackOptions(seed=np.int64(3), workers=np.int32(1), shard_samples=np.uint16(8))
    assert (opts.seed, opts.workers, opts.shard_samples) == (3, 1, 8)
    assert type(opts.seed) is int
    assert parse_size(np.int64(4096)) == 4096 and type(parse_size(np.int64(4096))) is int
    with pytest.raises(ConfigError, match="^size 0 must be >= 1 byte$"):
        parse_size(0)
    with pytest.raises(ConfigError, match=re.escape(f"seed={np.int64(-1)!r}; expected an "
                                                    "integer >= 0")):
        PackOptions(seed=np.int64(-1))
    plan = plan_epoch(10, seed=np.int64(0), epoch=np.int64(1), batch_size=np.int64(4),
                      rank=np.int32(0), world_size=np.int32(2))
    assert plan.batch_size == 4 and type(plan.batch_size) is int
