"""A CSV list whose rows are fsspec URLs (SRC in object storage): files are read
over HTTP from a server on localhost, for the local engine and for Ray, with the same result as
the files on disk; a missing object is quarantined with its read error. Reads are kept in
flight (shardkit.storage.fetch.iter_read): a server that counts the GETs it serves at once shows it."""
import csv
import functools
import json
import hashlib
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from shardkit.dataset.manifest import load_manifest, read_split_records
from shardkit.storage.fetch import iter_read
from shardkit.packer.run import pack

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "flowers-sample"
NO_HOST = "http://127.0.0.1:1"  # nothing listens on port 1: a connection error, not a 404


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class _Counting(_Quiet):
    """Serves each GET after a 20 ms wait (an object store's first-byte latency) and records
    the most GETs waiting at once."""
    lock = threading.Lock()
    now = most = served = 0

    def do_GET(self):
        cls = type(self)
        with cls.lock:
            cls.now += 1
            cls.most = max(cls.most, cls.now)
        try:
            time.sleep(0.02)
        finally:  # counted out before the response is sent: a client that got it may at once
            with cls.lock:  # send its next GET, which must not count as one more at once
                cls.now -= 1
                cls.served += 1
        super().do_GET()

    @classmethod
    def reset(cls):
        cls.now = cls.most = cls.served = 0


class _Server(ThreadingHTTPServer):
    request_queue_size = 64  # the default 5 drops connections beyond it (a 1 s SYN retry)


@pytest.fixture(scope="module")
def counting_server():
    handler = functools.partial(_Counting, directory=str(SAMPLE))
    httpd = _Server(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def server():
    handler = functools.partial(_Quiet, directory=str(SAMPLE))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _files() -> list[Path]:
    files = sorted(p for p in SAMPLE.rglob("*.jpg"))[:40]
    assert len(files) == 40
    return files


def _write_csv(path: Path, location, rel: list[str]) -> Path:
    """``path,label,group`` rows: ``location(r)`` for each sample path ``r`` below the sample,
    its class folder, and ``r`` as the group (the same for a URL and a local path, so both
    packs split alike)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label", "group"])
        w.writerows((location(r), r.split("/")[0], r) for r in rel)
    return path


def _by_sha(out) -> dict[str, tuple[str, str]]:
    manifest = load_manifest(out)
    return {r["sha256"]: (split, manifest["classes"][r["label"]])
            for split in manifest["splits"] for r in read_split_records(out, split)}


def test_http_rows_pack_like_local_files(tmp_path, server):
    files = _files()
    rel = [f.relative_to(SAMPLE).as_posix() for f in files]
    remote = _write_csv(tmp_path / "remote.csv",
                        lambda r: f"{NO_HOST}/{r}" if "no-host" in r else f"{server}/{r}",
                        rel + ["daisy/not-there.jpg", "daisy/no-host.jpg"])
    local = _write_csv(tmp_path / "local.csv", lambda r: str(SAMPLE / r), rel)
    opts = dict(progress=False, split_method="hash", near_duplicates="off")
    pack(remote, tmp_path / "out-remote", **opts)
    pack(local, tmp_path / "out-local", **opts)
    got, want = _by_sha(tmp_path / "out-remote"), _by_sha(tmp_path / "out-local")
    assert len(want) == 40 and got == want  # same bytes, labels and splits
    assert set(got) == {hashlib.sha256(f.read_bytes()).hexdigest() for f in files}
    records = [r for s in ("train", "val", "test")
               for r in read_split_records(tmp_path / "out-remote", s)]
    assert all(r["path"].startswith(server + "/") for r in records)
    quarantine = {q["path"]: q["reason"] for q in map(json.loads, (
        tmp_path / "out-remote" / "quarantine.jsonl").read_text().splitlines())}
    assert len(quarantine) == 2  # a 404 and a host that refuses: each with its own error
    assert quarantine[f"{server}/daisy/not-there.jpg"].startswith("unreadable: ") and \
        "404" in quarantine[f"{server}/daisy/not-there.jpg"]
    assert "Cannot connect to host 127.0.0.1:1" in quarantine[f"{NO_HOST}/daisy/no-host.jpg"]


@pytest.mark.ray
def test_http_rows_on_ray_equal_local_engine(tmp_path, server):
    ray = pytest.importorskip("ray")
    rel = [f.relative_to(SAMPLE).as_posix() for f in _files()[:16]]
    remote = _write_csv(tmp_path / "remote.csv", lambda r: f"{server}/{r}", rel)
    opts = dict(progress=False, split_method="hash", near_duplicates="off")
    pack(remote, tmp_path / "local", **opts)
    started = not ray.is_initialized()  # this test's own runtime, gone before the next module
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        pack(remote, tmp_path / "ray", engine="ray", **opts)
    finally:
        if started:
            ray.shutdown()
    assert load_manifest(tmp_path / "local")["splits"] == load_manifest(tmp_path / "ray")["splits"]
    for name in ("splits/train.jsonl", "quarantine.jsonl"):
        assert (tmp_path / "local" / name).read_bytes() == (tmp_path / "ray" / name).read_bytes()
    shards = sorted(p.name for p in (tmp_path / "local" / "shards").iterdir())
    assert shards and all((tmp_path / "local" / "shards" / n).read_bytes()
                          == (tmp_path / "ray" / "shards" / n).read_bytes() for n in shards)


@pytest.mark.parametrize("concurrency", [1, 8])
def test_reads_stay_in_flight_in_order(tmp_path, counting_server, concurrency):
    rel = [f.relative_to(SAMPLE).as_posix() for f in _files()[:24]]
    local_missing = str(tmp_path / "gone.jpg")
    locations = [f"{counting_server}/{r}" for r in rel]
    locations[5] = f"{counting_server}/daisy/not-there.jpg"
    locations.insert(10, local_missing)
    locations.insert(11, str(SAMPLE / rel[0]))
    _Counting.reset()
    got = list(iter_read(locations, concurrency))
    assert _Counting.most == concurrency and _Counting.served == 24  # 404 included
    assert len(got) == 26
    for loc, (data, error) in zip(locations, got):
        if loc.endswith("not-there.jpg"):
            assert data is None and isinstance(error, FileNotFoundError)
        elif loc == local_missing:
            assert data is None and isinstance(error, FileNotFoundError)
        else:  # the bytes of that very file, in input order
            file = Path(loc) if loc.startswith("/") else SAMPLE / loc.split("/", 3)[3]
            assert error is None and data == file.read_bytes()


def test_closing_early_leaves_no_read_running(counting_server):
    _Counting.reset()
    reads = iter_read([f"{counting_server}/{f.relative_to(SAMPLE).as_posix()}"
                       for f in _files()], 4)
    first = next(reads)
    assert first[1] is None and first[0] == _files()[0].read_bytes()
    reads.close()  # waits for the reads in flight; submits no more
    assert _Counting.now == 0 and _Counting.served <= 1 + 4


def test_the_write_step_reads_in_flight_too(tmp_path, counting_server, monkeypatch):
    from shardkit.packer import write as pack_write

    rel = [f.relative_to(SAMPLE).as_posix() for f in _files()]
    src = _write_csv(tmp_path / "remote.csv", lambda r: f"{counting_server}/{r}", rel)
    write_quarantine = pack_write.write_quarantine

    def reset_then_write(*a, **k):  # called right before the shards are written
        _Counting.reset()
        return write_quarantine(*a, **k)

    monkeypatch.setattr(pack_write, "write_quarantine", reset_then_write)
    pack(src, tmp_path / "out", read_concurrency=5, progress=False, split={"train": 1.0},
         near_duplicates="off")
    assert _Counting.served == 40 and _Counting.most == 5  # the write step's re-reads only


def test_concurrent_check_gives_the_serial_result(tmp_path, counting_server):
    rel = [f.relative_to(SAMPLE).as_posix() for f in _files()]
    src = _write_csv(tmp_path / "remote.csv", lambda r: f"{counting_server}/{r}",
                     rel + ["daisy/not-there.jpg"])
    opts = dict(progress=False, split_method="hash", near_duplicates="merge")
    _Counting.reset()
    pack(src, tmp_path / "serial", read_concurrency=1, **opts)
    assert _Counting.most == 1
    for workers in (1, 2):
        _Counting.reset()
        out = tmp_path / f"concurrent-{workers}"
        pack(src, out, read_concurrency=6, workers=workers, **opts)
        assert _Counting.most >= 6  # several GETs at once (two processes: up to 12)
        for name in ("splits/train.jsonl", "splits/val.jsonl", "quarantine.jsonl"):
            assert (out / name).read_bytes() == (tmp_path / "serial" / name).read_bytes()
        assert load_manifest(out)["splits"] == load_manifest(tmp_path / "serial")["splits"]
