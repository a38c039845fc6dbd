"""The remote-shard prefetcher (shardkit/stream/prefetch.py): a packed wds split served by
``http.server`` on 127.0.0.1 with 30 ms of latency per request, read through an ``http://`` URL.
An epoch yields the local epoch's keys, labels and pixels; each shard is fetched once per epoch;
the memory bound holds (the prefetcher's high-water mark, a count of bytes); a shard answering
404 or 500 raises a ShardFetchError naming its URL; close() leaves no fetch thread; a resumed
epoch yields the rest of the uninterrupted one. Nothing here depends on timing."""
from __future__ import annotations

import gc
import logging
import threading
import weakref
from collections import Counter

import numpy as np
import pytest
import torch

from shardkit.errors import ConfigError, ShardCorruptError, ShardFetchError
from shardkit.stream import SamplingOptions, WorkerOptions, make_loader
from shardkit.stream import prefetch
from shardkit.stream.prefetch import (ShardPrefetcher, plan_shards, prefetch_threads,
                                      schedule_epoch)
from helpers import build_split, serve_http

SIZES = [12, 9, 15, 4, 7, 3, 20, 6, 11, 5]  # 92 real photos in 10 uneven shards
SHARDS = [f"/shards/train-{i:06d}.tar" for i in range(len(SIZES))]


def _shard_gets(counter: Counter) -> Counter:
    return Counter({p: n for p, n in counter.items() if p.startswith("/shards/")})


@pytest.fixture
def data(sample_dir, tmp_path):
    root = tmp_path / "data"
    build_split(sample_dir, root, "wds", SIZES, stride=3)
    return root


@pytest.fixture
def slow(data):
    """``(url, counter, fail)``: the split over HTTP, every request 30 ms late."""
    fail: dict = {}
    with serve_http(data, latency=0.03, fail=fail) as (url, counter):
        yield url, counter, fail


def _epoch(loader) -> tuple[dict, list]:
    """``({index: (pixels, label)}, [(images, labels, index) per batch])`` of one epoch."""
    by_index, batches = {}, []
    for images, labels, meta in loader:
        batches.append((images.clone(), labels.clone(), meta["index"].clone()))
        for x, y, i in zip(images, labels, meta["index"].tolist()):
            by_index[i] = (x.numpy().copy(), int(y))
    return by_index, batches


def _total_bytes(root) -> int:
    return sum(p.stat().st_size for p in (root / "shards").glob("*.tar"))


@pytest.mark.parametrize("train", [True, False])
def test_http_epoch_with_latency_is_the_local_epoch(data, slow, train):
    """Same keys, labels and pixels as the local copy, batch for batch under the same plan
    (shard-block order given to both: it is the remote default); every shard fetched once."""
    url, counter, _ = slow
    opts = dict(num_workers=2, image_size=24, seed=5, return_meta=True, train=train,
                sampling=SamplingOptions(block=True, shuffle=train))
    with make_loader(data, "train", 4, **opts) as local, \
            make_loader(url, "train", 4, **opts) as remote:
        local.set_epoch(1)
        remote.set_epoch(1)
        want, want_batches = _epoch(local)
        got, got_batches = _epoch(remote)
        assert local.dataset.source.prefetcher is None  # local reads are unchanged
        pf = remote.dataset.source.prefetcher
        assert pf is not None and sum(pf.fetches.values()) == len(SIZES)
    assert sorted(got) == sorted(want) == list(range(sum(SIZES)))
    for i, (x, y) in want.items():
        assert got[i][1] == y and np.array_equal(got[i][0], x), i
    assert len(got_batches) == len(want_batches)
    for (gx, gy, gi), (wx, wy, wi) in zip(got_batches, want_batches):
        assert torch.equal(gi, wi) and torch.equal(gy, wy) and torch.equal(gx, wx)
    assert _shard_gets(counter) == {p: 1 for p in SHARDS}


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_each_shard_fetched_once_per_epoch_within_a_bound_below_the_split(data, slow, backend):
    """A bound below the split (the least that lets every epoch's order be prefetched: the
    schedule's peak): three epochs, each exactly-once; epoch 0 fetches every shard once, later
    epochs each shard at most once (some stay in memory from the last epoch in the thread
    backend); the prefetcher never held more than the bound."""
    url, counter, _ = slow
    probe = make_loader(url, "train", 4, num_workers=2, image_size=8)
    sizes = [rec["bytes"] for rec in probe.dataset.source.shards]
    shard_of = probe.dataset.source.index.shard

    def peak(epoch, worker, workers):
        plan = probe.dataset.plan(epoch)
        shards = plan_shards(plan, plan.worker_batches(worker, workers), shard_of)
        return schedule_epoch(*shards, sizes).peak_bytes * workers  # each worker: bound // k

    bound = max(max(peak(e, 0, 1), peak(e, 0, 2), peak(e, 1, 2)) for e in range(3))
    bound = max(bound, 2 * max(sizes))
    probe.close()
    assert bound < _total_bytes(data)
    loader = make_loader(url, "train", 4, num_workers=2, image_size=8, return_meta=True,
                         workers=WorkerOptions(backend=backend, shard_prefetch_bytes=bound))
    seen = Counter()
    for epoch in range(3):
        loader.set_epoch(epoch)
        idx = torch.cat([m["index"] for _, _, m in loader]).numpy()
        assert np.array_equal(np.sort(idx), np.arange(sum(SIZES)))
        gets = _shard_gets(counter) - seen
        seen += gets
        if backend == "thread":
            assert set(gets) <= set(SHARDS) and max(gets.values(), default=0) == 1, gets
            if epoch == 0:
                assert gets == {p: 1 for p in SHARDS}
            pf = loader.dataset.source.prefetcher
            assert pf is not None and 0 < pf.high_water <= bound, (pf.stats(), bound)
        else:  # two workers, one contiguous stream each: the shard their streams share twice
            assert set(gets) == set(SHARDS) and sum(gets.values()) <= len(SIZES) + 1, gets
    loader.close()


def test_bound_is_counted_in_bytes_and_a_larger_shard_is_fetched_alone():
    """A prefetcher over fake shards (bytes of known sizes), 3 fetch threads, read in order:
    when each fetch starts, the bytes held (kept shards plus reservations of the fetches in
    flight) are within the bound, but for the shard larger than the bound, which is fetched
    alone; every shard is fetched once."""
    sizes = [300, 500, 200, 1500, 400, 300, 600]
    bound = 1000
    during: dict = {}
    pf: ShardPrefetcher

    def fetch(url):
        s = int(url.rsplit("/", 1)[1])
        during[s] = pf.held_bytes  # this fetch's own reservation included
        return bytes(sizes[s])

    pf = ShardPrefetcher([f"mem://{i}" for i in range(len(sizes))],
                         [str(i) for i in range(len(sizes))], sizes, bound, threads=3,
                         fetch=fetch)
    visits = np.repeat(np.array([2, 0, 3, 1, 6, 4, 5]), 3)  # 3 samples per shard, 1 per batch
    sched = schedule_epoch(visits, np.arange(len(visits)), sizes)
    assert sched.order.tolist() == [2, 0, 3, 1, 6, 4, 5] and sched.peak_bytes == 0
    token = object()
    pf.schedule(token, sched)
    for s in visits.tolist():
        assert len(pf.get(s, token)) == sizes[s]
        assert pf.held_bytes <= bound or s == 3
        pf.consumed(token, np.array([s]))
    pf.close()
    assert during[3] == 1500  # alone
    assert all(0 < held <= bound for s, held in during.items() if s != 3), during
    assert pf.high_water == 1500 and pf.fetches == {s: 1 for s in range(len(sizes))}
    assert prefetch_threads() == []


def test_a_reader_of_another_epoch_does_not_wait():
    """get() for a token that is not the scheduled epoch returns None at once for a shard not
    in memory (a batch of an abandoned epoch reads it another way)."""
    release = threading.Event()

    def fetch(url):
        release.wait(10)
        return bytes(10)

    pf = ShardPrefetcher(["mem://0", "mem://1"], ["0", "1"], [10, 10], 100, fetch=fetch)
    pf.schedule("old", schedule_epoch(np.array([0, 1]), np.array([0, 1]), [10, 10]))
    pf.schedule("new", schedule_epoch(np.array([1, 0]), np.array([0, 1]), [10, 10]))
    assert pf.get(0, "old") is None
    release.set()
    assert pf.get(0, "new") == bytes(10) and pf.get(1, "new") == bytes(10)
    assert pf.get(1, "old") == bytes(10)  # in memory: served to any reader
    pf.close()
    assert prefetch_threads() == []


def test_schedule_first_need_order_and_peak():
    """Shards in the order they are first read; the peak counts the shards some unfinished
    batch still needs at once."""
    shards = np.array([1, 1, 0, 0, 2, 2, 0, 3])
    batches = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    sched = schedule_epoch(shards, batches, [10, 20, 40, 80])
    assert sched.order.tolist() == [1, 0, 2, 3]
    assert sched.counts.tolist() == [3, 2, 2, 1]
    # batch 2 needs shard 2 while shard 0 (read again in batch 3) is still open: 10 + 40;
    # batch 3 reads shards 0 and 3 (10 + 80)
    assert sched.peak_bytes == 90


@pytest.mark.parametrize("status", [404, 500])
def test_a_shard_that_fails_mid_epoch_raises_naming_its_url(data, slow, status, monkeypatch):
    """A shard answering 404 or 500 (the fifth shard the plan reads: mid-epoch) stops the epoch
    with a ShardFetchError naming the shard and its URL, also under on_error="skip" (no short
    epoch); a 500 is tried FETCH_ATTEMPTS times, a 404 once."""
    monkeypatch.setattr("shardkit.storage.fetch.RETRY_DELAY_S", 0.0)
    url, counter, fail = slow
    loader = make_loader(url, "train", 4, num_workers=2, image_size=8, on_error="skip",
                         sampling=SamplingOptions(shuffle=False))
    plan = loader.dataset.plan()
    order = schedule_epoch(*plan_shards(plan, plan.worker_batches(0, 1),
                                        loader.dataset.source.index.shard), [1] * len(SIZES))
    bad = int(order.order[4])
    fail[SHARDS[bad]] = status
    batches = 0
    with pytest.raises(ShardFetchError) as info:
        for _ in loader:
            batches += 1
    loader.close()
    assert batches < len(loader)
    err = info.value
    assert err.shard == SHARDS[bad][1:] and err.url == url.rstrip("/") + SHARDS[bad]
    assert err.url in str(err) and str(status) in str(err), str(err)
    assert counter[SHARDS[bad]] == (1 if status == 404 else prefetch.FETCH_ATTEMPTS)
    assert prefetch_threads() == []


def test_close_stops_the_fetch_threads(data, slow):
    """Mid-epoch (the consumer stops after one batch) and after a whole epoch: close() leaves
    no fetch thread alive."""
    url, _, _ = slow
    loader = make_loader(url, "train", 4, num_workers=2, image_size=8)
    it = iter(loader)
    next(it)
    assert prefetch_threads()
    it.close()
    loader.close()
    assert prefetch_threads() == []
    with make_loader(url, "train", 4, num_workers=2, image_size=8) as loader:
        assert len(list(loader)) == len(loader)
    assert prefetch_threads() == []
    assert not [t for t in threading.enumerate() if t.name.startswith("shardkit-prefetch")]


def test_a_loader_dropped_without_close_frees_its_shards(data, slow):
    """The fetch threads hold the prefetcher only between jobs: a loader dropped without
    close() is collected with its shards, and its threads end."""
    url, _, _ = slow
    loader = make_loader(url, "train", 4, num_workers=2, image_size=8)
    assert len(list(loader)) == len(loader)
    ref = weakref.ref(loader.dataset.source.prefetcher)
    threads = prefetch_threads()
    assert threads
    del loader
    gc.collect()
    for t in threads:
        t.join(30)  # each ends within prefetch._IDLE_WAIT_S once the prefetcher is gone
    assert ref() is None and prefetch_threads() == []


def test_resume_mid_epoch_yields_the_rest_of_the_epoch(data, slow):
    """Stopped after 7 batches and resumed in a new loader over the URL: the remaining batches
    are those of the uninterrupted epoch, pixels and order; the resumed run fetches only the
    shards its batches read."""
    url, counter, _ = slow
    opts = dict(num_workers=2, image_size=16, seed=3, return_meta=True)
    with make_loader(url, "train", 4, **opts) as whole:
        whole.set_epoch(2)
        _, want = _epoch(whole)
    with make_loader(url, "train", 4, **opts) as first:
        first.set_epoch(2)
        it = iter(first)
        for _ in range(7):
            next(it)
        state = first.state_dict()
        it.close()
    before = _shard_gets(counter)
    with make_loader(url, "train", 4, **opts) as resumed:
        resumed.load_state_dict(state)
        _, got = _epoch(resumed)
        plan = resumed.dataset.plan()
        needed = set(resumed.dataset.source.index.shard[plan.positions[7 * 4:]].tolist())
    assert len(got) == len(want) - 7
    for (gx, gy, gi), (wx, wy, wi) in zip(got, want[7:]):
        assert torch.equal(gi, wi) and torch.equal(gy, wy) and torch.equal(gx, wx)
    assert _shard_gets(counter) - before == {SHARDS[s]: 1 for s in needed}


def test_an_order_over_the_bound_is_read_lazily_with_a_warning(data, slow, caplog):
    """block=False and shuffled: every shard stays needed to the end of the epoch, more than a
    bound of two shards: no prefetch (one warning), the epoch still whole."""
    url, _, _ = slow
    bound = 2 * max(p.stat().st_size for p in (data / "shards").glob("*.tar"))
    with caplog.at_level(logging.WARNING, "shardkit.stream"):
        with make_loader(url, "train", 4, num_workers=2, image_size=8, return_meta=True,
                         sampling=SamplingOptions(block=False, shuffle=True),
                         workers=WorkerOptions(shard_prefetch_bytes=bound)) as loader:
            idx = torch.cat([m["index"] for _, _, m in loader]).numpy()
            assert loader.dataset.source.prefetcher is None
    assert np.array_equal(np.sort(idx), np.arange(sum(SIZES)))
    (said,) = [r.getMessage() for r in caplog.records if "over the prefetch bound" in r.getMessage()]
    need = int(said.split("shard_prefetch_bytes=...) to at least ")[1].split(";")[0])
    assert need >= _total_bytes(data) - 2048 * len(SIZES) and need > bound   # every shard, held
    with make_loader(url, "train", 4, num_workers=2, image_size=8,        # the advice works
                     sampling=SamplingOptions(block=False, shuffle=True),
                     workers=WorkerOptions(shard_prefetch_bytes=need)) as loader:
        next(iter(loader))
        assert loader.dataset.source.prefetcher is not None


def test_shard_prefetch_bytes_is_checked():
    assert WorkerOptions(shard_prefetch_bytes=0).shard_prefetch_bytes == 0
    for bad in (-1, 1.5, True, "1GB"):
        with pytest.raises(ConfigError, match="shard_prefetch_bytes"):
            WorkerOptions(shard_prefetch_bytes=bad)


@pytest.mark.parametrize("prefetch_bytes", [None, 0])
def test_a_truncated_or_failing_shard_never_gives_a_short_epoch_under_skip(data, prefetch_bytes,
                                                                        monkeypatch):
    """on_error="skip" leaves out damaged samples, never a whole shard: a remote shard cut short
    (not the manifest's size) is a ShardCorruptError naming it, and one whose GETs fail is a
    ShardFetchError, with the prefetcher (default) and without it (each shard fetched on its
    first read); a local dataset refuses the same damage before its first batch."""
    monkeypatch.setattr("shardkit.storage.fetch.RETRY_DELAY_S", 0.0)
    cut = data.parent / "cut"
    import shutil

    shutil.copytree(data, cut)
    shard = cut / SHARDS[3][1:]
    shard.write_bytes(shard.read_bytes()[:-2048])
    workers = WorkerOptions() if prefetch_bytes is None else WorkerOptions(
        shard_prefetch_bytes=prefetch_bytes)
    with serve_http(cut) as (url, counter):
        loader = make_loader(url, "train", 4, num_workers=2, image_size=8, on_error="skip",
                             sampling=SamplingOptions(shuffle=False), workers=workers)
        with pytest.raises(ShardCorruptError) as info:
            for _ in loader:
                pass
        loader.close()
        assert info.value.shard == SHARDS[3][1:] and info.value.key is None
        assert "the manifest says" in str(info.value) and loader.skipped == []
    with serve_http(data, fail={SHARDS[3]: 500}) as (url, counter):
        loader = make_loader(url, "train", 4, num_workers=2, image_size=8, on_error="skip",
                             sampling=SamplingOptions(shuffle=False), workers=workers)
        with pytest.raises(ShardFetchError) as info:
            for _ in loader:
                pass
        loader.close()
        assert info.value.shard == SHARDS[3][1:] and "500" in str(info.value)
        assert counter[SHARDS[3]] == prefetch.FETCH_ATTEMPTS and loader.skipped == []
