"""Helpers several test modules share (not a test module: pytest collects nothing here).

- :func:`build_split`: a split of real photos written with the formats API, shards of exact
  sizes, independent of ``shardkit.pack`` (the read-path tests);
- :func:`serve_http`: a folder served over HTTP on 127.0.0.1, counting GETs (remote reads),
  with an optional latency per request and failing paths;
- :func:`placeholder`: a made "image not found" placeholder JPEG (degenerate-image tests).

Fixtures stay in ``conftest.py``; these are plain functions, imported as ``from helpers import``.
"""
from __future__ import annotations

import functools
import hashlib
import io
import json
import threading
import time
from collections import Counter
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from shardkit.dataset.manifest import sample_checksum, write_manifest, write_split_files
from shardkit.formats import get_format

CLASSES = ["daisy", "dandelion", "roses", "sunflowers", "tulips"]
"""The embedded sample's classes (examples/flowers-sample), label ``i`` = ``CLASSES[i]``."""


def build_split(sample_dir: Path, out: Path, fmt: str, shard_sizes: list[int],
                split: str = "train", start: int = 0, stride: int = 1) -> list[dict]:
    """Packs real photos of the embedded sample (reused cyclically beyond 200) into shards of
    exactly ``shard_sizes`` samples with the formats API (independent of shardkit.pack). Returns
    the per-sample records (with the source sha256), in split order. Photos are taken from
    sorted position ``start`` every ``stride`` (the sorted list is class-sorted). Several splits
    can share ``out``."""
    photos = sorted(sample_dir.glob("*/*.jpg"))  # 200 real photos, reused cyclically if needed
    files = [photos[(start + i * stride) % len(photos)] for i in range(sum(shard_sizes))]
    mod = get_format(fmt)
    (out / "shards").mkdir(parents=True, exist_ok=True)
    records, shards, i = [], [], 0
    for s, count in enumerate(shard_sizes):
        rel = f"shards/{split}-{s:06d}{mod.suffix}"
        writer = mod.Writer(out / rel)
        for p in files[i:i + count]:
            data = p.read_bytes()
            key = f"{split}_{i:08d}"
            label = CLASSES.index(p.parent.name)
            offset = writer.add(key, data, "jpg", label)
            records.append(dict(key=key, shard=s, offset=offset, size=len(data), label=label,
                                path=p.relative_to(sample_dir).as_posix(),
                                sha256=hashlib.sha256(data).hexdigest(),
                                xxh3=f"{sample_checksum(data):016x}"))
            i += 1
        writer.close()
        shards.append({"path": rel, "num_samples": count, "bytes": (out / rel).stat().st_size,
                       "sha256": hashlib.sha256((out / rel).read_bytes()).hexdigest()})
    write_split_files(out, split, records)
    manifest_path = out / "manifest.json"
    manifest = (json.loads(manifest_path.read_text()) if manifest_path.exists()
                else {"format": fmt, "classes": CLASSES, "splits": {}})
    manifest.pop("schema_version", None)
    manifest["splits"][split] = {"num_samples": len(records), "shards": shards}
    write_manifest(out, manifest)
    return records


class _CountingHandler(SimpleHTTPRequestHandler):
    requests: Counter  # set per server
    latency: float = 0.0
    fail: dict | None = None

    def do_GET(self):  # noqa: N802 - http.server API
        self.requests[self.path] += 1
        if self.latency:
            time.sleep(self.latency)
        status = (self.fail or {}).get(self.path)
        if status:
            self.send_error(status)
            return
        super().do_GET()

    def do_HEAD(self):  # noqa: N802 - http.server API
        if self.latency:
            time.sleep(self.latency)
        super().do_HEAD()

    def log_message(self, *args):  # keep test output clean
        pass


@contextmanager
def serve_http(root, latency: float = 0.0, fail: dict | None = None):
    """``(url, counter)``: ``root`` served on 127.0.0.1; ``counter[path]`` counts GETs.

    ``latency``: seconds every GET and HEAD waits before its answer (an object store's time to
    first byte). ``fail``: ``{path: HTTP status}`` answered instead of the file (e.g.
    ``{"/shards/train-000001.tar": 500}``); the caller may change it while serving."""
    counter: Counter = Counter()
    handler = type("H", (_CountingHandler,), {"requests": counter, "latency": float(latency),
                                              "fail": fail})
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", counter
    finally:
        server.shutdown()
        server.server_close()


def placeholder(w: int = 400, h: int = 300, size: int = 24) -> bytes:
    """An "image not found" placeholder: an icon outline and a line of text on flat gray, JPEG."""
    im = Image.new("RGB", (w, h), (230, 230, 230))
    draw = ImageDraw.Draw(im)
    draw.rectangle((w // 2 - 30, h // 2 - 60, w // 2 + 30, h // 2 - 10), outline=(150,) * 3,
                   width=3)
    draw.text((w // 2, h // 2 + 20), "image not found", fill=(90,) * 3,
              font=ImageFont.load_default(size=size), anchor="mm")
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=80)
    return buf.getvalue()
