"""Reads a shardkit ``wds`` dataset with NVIDIA DALI's ``fn.readers.webdataset``, through the
index files shardkit wrote (``OUT/shards/<split>-NNNNNN.idx``), and checks every split against
the manifest: sample count, label (``.cls``) and stored image bytes (size; sha256 where the
sample is stored as the source file) of every sample, in order. Also times DALI's pipeline start
with the index files against without them (DALI then indexes every tar itself), as a ratio of
the fastest of 3 starts each.

DALI is not a shardkit dependency (a ~400 MB wheel); this script needs only DALI and the
standard library, so it runs from any Python that has DALI (CPU only is enough):

    python -m venv /tmp/dali && /tmp/dali/bin/pip install nvidia-dali-cuda120
    .venv/bin/shardkit pack examples/flowers-sample out/pack          # or: shardkit export
    /tmp/dali/bin/python benchmarks/check_dali.py out/pack

``tests/test_interop.py::test_dali_reads_with_the_index_files`` (marked ``slow``) runs it with
``$SHARDKIT_DALI_PYTHON`` (default: the test's own Python) and skips when DALI is missing there.
Exit 0 when every split matches, 1 on a mismatch (printed), 2 when it cannot run.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

BATCH = 32


def _read_split(root: Path, shards: list[str], with_index: bool, n: int):
    """(labels, image bytes) of the first ``n`` samples DALI reads from ``shards``, in order,
    and the seconds the pipeline took to build (where DALI reads or makes the index)."""
    from nvidia.dali import fn, pipeline_def

    paths = [str(root / s) for s in shards]
    index = [str(root / (s.rsplit(".", 1)[0] + ".idx")) for s in shards] if with_index else None

    @pipeline_def(batch_size=BATCH, num_threads=2, device_id=None, prefetch_queue_depth=1)
    def pipe():
        return tuple(fn.readers.webdataset(
            paths=paths, index_paths=index, ext=["jpg;png", "cls"], name="reader",
            missing_component_behavior="error", pad_last_batch=True))

    started = time.perf_counter()
    p = pipe()
    p.build()
    built = time.perf_counter() - started
    labels, images = [], []
    while len(labels) < n:
        image_batch, cls_batch = p.run()
        for i in range(len(cls_batch)):
            raw = bytes(cls_batch.at(i))  # ASCII decimal; other bytes: a wrong index entry
            labels.append(int(raw) if raw.strip().isdigit() else raw[:8])
            images.append(bytes(image_batch.at(i)))
    return labels[:n], images[:n], built


def check(root: Path) -> list[str]:
    """Problems found (empty when DALI reads every split exactly as the manifest says)."""
    manifest = json.loads((root / "manifest.json").read_text())
    if manifest["format"] != "wds":
        raise SystemExit(f"error: {root} holds {manifest['format']} shards, not wds")
    problems, ratios = [], []
    for split, info in manifest["splits"].items():
        if not info["num_samples"]:
            continue
        shards = [s["path"] for s in info["shards"]]
        missing = [s for s in shards if not (root / (s.rsplit(".", 1)[0] + ".idx")).is_file()]
        if missing:
            problems.append(f"{split}: no index file for {missing[0]} (run shardkit export "
                            f"{root} --to dali)")
            continue
        lines = (root / "splits" / f"{split}.jsonl").read_text("utf-8").splitlines()
        records = [json.loads(line) for line in lines if line.strip()]
        records.sort(key=lambda r: (r["shard"], r["offset"]))  # tar order
        labels, images, with_index = _read_split(root, shards, True, len(records))
        with_index = min([with_index] + [_read_split(root, shards, True, 0)[2]
                                         for _ in range(2)])
        without = min(_read_split(root, shards, False, 0)[2] for _ in range(3))
        ratios.append(without / with_index)
        for r, label, data in zip(records, labels, images):
            if label != r["label"] or len(data) != r["size"] or (
                    r.get("rule") == "original"
                    and hashlib.sha256(data).hexdigest() != r["sha256"]):
                problems.append(f"{split}: sample {r['key']}: DALI read label {label}, "
                                f"{len(data)} bytes; the manifest says {r['label']}, {r['size']}")
        print(f"{split}: {len(records)} samples read by DALI with {len(shards)} index file(s); "
              f"pipeline start without/with the index: {without / with_index:.2f}x")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="a shardkit wds dataset folder")
    args = parser.parse_args(argv)
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        print("error: nvidia.dali is not installed in this Python (pip install "
              "nvidia-dali-cuda120)", file=sys.stderr)
        return 2
    if not (args.out / "manifest.json").is_file():
        print(f"error: {args.out}/manifest.json not found: not a shardkit dataset",
              file=sys.stderr)
        return 2
    problems = check(args.out)
    for p in problems:
        print(f"FAIL {p}")
    print(f"check_dali {args.out}: {'OK' if not problems else f'{len(problems)} problem(s)'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
