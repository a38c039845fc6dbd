"""Pack the embedded flower sample in many configurations and print every output file's sha256.

Used to prove a refactor changed no byte of what ``shardkit pack`` writes: run it once with the
old checkout and once with the new one (the same ``--sample`` path, so the manifests' ``source.root``
agree), then compare the two JSON files::

    PYTHONPATH=OLD python scripts/pack_fingerprint.py --out /tmp/old.json
    PYTHONPATH=NEW python scripts/pack_fingerprint.py --out /tmp/new.json
    python scripts/pack_fingerprint.py --compare /tmp/old.json /tmp/new.json

The configurations cover the three formats, both engines, both split methods, given splits
(folder and CSV column), a CSV list source, ``--max-side``, explicit shard sizes, ``--overwrite``
and an object-store ``OUT`` (a local moto S3 server; skipped with a note when moto is missing).
Exit 0 when the files are identical, 1 listing each configuration and file that differs. An LMDB
shard is compared by its records (its free pages hold arbitrary bytes, so two packs of one input
differ there; packs since the writer zeroes them are byte-identical), and the manifest with LMDB
shards' file sha256 left out. ``manifest.json without writer`` compares the manifest without its
``writer`` section (the writer's options, recorded since that section was added).
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "examples" / "flowers-sample"
WORK = Path(tempfile.gettempdir()) / "shardkit-pack-fingerprint"


def _sources(sample: Path) -> dict[str, Path]:
    """Derived sources, rebuilt identically on every run (same absolute paths)."""
    src = WORK / "src"
    if src.exists():
        shutil.rmtree(src)
    given = src / "given"
    with open(sample / "metadata.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for i, row in enumerate(rows):
        split = "val" if i % 5 == 0 else "train"
        dst = given / split / row["path"]
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(sample / row["path"], dst)
    listing = src / "list.csv"
    with open(listing, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label", "split"])
        for i, row in enumerate(rows):
            w.writerow([str(sample / row["path"]), row["label"], "val" if i % 4 == 0 else "train"])
    return {"sample": sample, "given": given, "list": listing,
            "metadata": sample / "metadata.csv"}


def configs(src: dict[str, Path]) -> dict[str, list[str]]:
    s, m = str(src["sample"]), str(src["metadata"])
    return {
        "wds-default": [s],
        "lmdb": [s, "--format", "lmdb"],
        "hdf5": [s, "--format", "hdf5"],
        "wds-group-balanced": [s, "--metadata", m, "--group-column", "group_flickr_user",
                               "--split-method", "balanced", "--seed", "3"],
        "lmdb-group-regex": [s, "--format", "lmdb", "--group-by", r"/(\d)[^/]*$",
                             "--split", "train=0.7,val=0.3"],
        "wds-given-folders": [str(src["given"])],
        "hdf5-given-csv-column": [str(src["list"]), "--format", "hdf5", "--split", "given",
                                  "--split-column", "split"],
        "wds-csv-ratios": [str(src["list"]), "--near-duplicates", "off"],
        "wds-max-side": [s, "--max-side", "128", "--jpeg-quality", "90", "--shard-samples", "50"],
        "lmdb-max-side-shard-bytes": [s, "--format", "lmdb", "--max-side", "200",
                                      "--shard-bytes", "1MB"],
        "wds-near-report-strict": [s, "--near-duplicates", "report", "--strict", "--workers", "2"],
        "wds-ray": [s, "--engine", "ray", "--workers", "2"],
    }


def _lmdb_digest(path: Path) -> str:
    """sha256 of an LMDB file's records (key, value, in key order): LMDB's free pages hold
    whatever memory the writer had, so two identical packs differ in their file bytes."""
    import lmdb

    h = hashlib.sha256()
    with lmdb.open(str(path), subdir=False, readonly=True, lock=False) as env:
        with env.begin() as txn:
            for key, value in txn.cursor():
                h.update(len(key).to_bytes(8, "little") + key)
                h.update(len(value).to_bytes(8, "little") + value)
    return "records:" + h.hexdigest()


def _manifest_digest(manifest: dict) -> str:
    """sha256 of a parsed manifest (keys sorted), with LMDB shards' file sha256 left out: an
    LMDB shard's file bytes varied as its free pages did (they are compared by records)."""
    for split in manifest.get("splits", {}).values():
        for shard in split.get("shards", []):
            if shard.get("path", "").endswith(".lmdb"):
                shard["sha256"] = "(lmdb file bytes)"
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


def _digest(path: Path) -> str:
    if path.suffix == ".lmdb":
        return _lmdb_digest(path)
    if path.name == "manifest.json":
        return _manifest_digest(json.loads(path.read_text()))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _without_writer(manifest: dict) -> dict:
    """The manifest without its ``writer`` section (the record of the writer's options, which
    packs made before it was added do not have)."""
    manifest.pop("writer", None)
    return manifest


def _digests(root: Path) -> dict[str, str]:
    out = {str(p.relative_to(root)): _digest(p)
           for p in sorted(root.rglob("*")) if p.is_file()}
    if (root / "manifest.json").is_file():
        out["manifest.json without writer"] = _manifest_digest(
            _without_writer(json.loads((root / "manifest.json").read_text())))
    return out


def _pack(args: list[str], out: str, env: dict | None = None) -> str:
    cmd = [sys.executable, "-m", "shardkit.cli", "pack", *args[:1], out, *args[1:],
           "--no-progress"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        return f"exit {r.returncode}: {r.stderr.strip().splitlines()[-1:]}"
    return ""


def _s3(src: dict[str, Path]) -> dict[str, str] | str:
    try:
        import boto3
        from moto.server import ThreadedMotoServer
    except ImportError:
        return "skipped: needs moto[server] and boto3 (the test extra)"
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
               "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        client.create_bucket(Bucket="fingerprint")
        err = _pack([str(src["sample"])], "s3://fingerprint/ds", env)
        if err:
            return err
        out = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket="fingerprint", Prefix="ds/"):
            for obj in page.get("Contents", []):
                body = client.get_object(Bucket="fingerprint", Key=obj["Key"])["Body"].read()
                out[obj["Key"][len("ds/"):]] = hashlib.sha256(body).hexdigest()
                if obj["Key"] == "ds/manifest.json":
                    out["manifest.json without writer"] = _manifest_digest(
                        _without_writer(json.loads(body)))
        return out
    finally:
        server.stop()


def run(out_json: Path, sample: Path) -> None:
    src = _sources(sample.resolve())
    result: dict[str, object] = {}
    for name, args in configs(src).items():
        out = WORK / "out" / name
        if out.exists():
            shutil.rmtree(out)
        err = _pack(args, str(out))
        if not err and name == "wds-default":  # a second pack over it: the --overwrite swap
            err = _pack([*args, "--seed", "1", "--overwrite"], str(out))
        result[name] = err or _digests(out)
        print(f"{name}: {err or f'{len(result[name])} files'}", file=sys.stderr)
    result["wds-s3-out"] = _s3(src)
    print(f"wds-s3-out: {result['wds-s3-out'] if isinstance(result['wds-s3-out'], str) else 'ok'}",
          file=sys.stderr)
    out_json.write_text(json.dumps(result, indent=1, sort_keys=True))


def compare(a: Path, b: Path) -> int:
    old, new = json.loads(a.read_text()), json.loads(b.read_text())
    bad = 0
    for name in sorted(set(old) | set(new)):
        x, y = old.get(name), new.get(name)
        if x == y:
            print(f"same  {name}" + (f" ({x})" if isinstance(x, str) else f" ({len(x)} files)"))
            continue
        bad += 1
        if isinstance(x, dict) and isinstance(y, dict):
            diff = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
            print(f"DIFF  {name}: {', '.join(diff)}")
        else:
            print(f"DIFF  {name}: {x!r:.200} != {y!r:.200}")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="write the digests here")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("OLD", "NEW"))
    ap.add_argument("--sample", type=Path, default=SAMPLE,
                    help="the ImageFolder to pack (give both runs the same path)")
    a = ap.parse_args()
    if a.compare:
        return compare(*a.compare)
    if not a.out:
        ap.error("give --out FILE or --compare OLD NEW")
    run(a.out, a.sample)
    return 0


if __name__ == "__main__":
    sys.exit(main())
