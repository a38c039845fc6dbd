"""Fuzz worker for tests/test_fuzz.py: mutate a packed dataset, run every command and the loader
on each mutant, and report whether the rule of docs/RELIABILITY.md held.

The rule, for whatever a dataset folder holds: every command ends with a verdict (exit 0 or 1)
or exactly one ``Error:`` line (exit 2), never a traceback or a signal; nothing outside the
dataset folder is read or written; the loader serves every sample equal to the packed one, or
raises a :class:`shardkit.errors.ShardkitError`; ``verify`` says OK only when the loader does
serve the packed samples.

Run: ``python tests/fuzz_worker.py BASES.json WORK FIRST COUNT SEED REPORT.jsonl``. ``BASES``
maps a format name to a packed dataset and its truth (``truth.json`` beside it: every split's
``index -> [label, pixel hash]``). Mutant ``i`` (``FIRST <= i < FIRST + COUNT``) is drawn from
``random.Random(f"{SEED}:{i}")`` alone, so any mutant can be rebuilt from its number. One JSON
line per mutant goes to ``REPORT``: a ``start`` line before the mutant runs (a worker killed by
a signal leaves it without its ``done`` line, and the parent names that mutant) and a ``done``
line with every failure found.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import random
import shutil
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np

# --------------------------------------------------------------------------- mutations
SPLITS = ("train", "val", "test")
OUTSIDE_TAG = "[names a file outside]"
"""Marks a mutation whose manifest entry points outside the folder, at identical copies of the
shards: a reader that follows it would serve the packed pixels, so only refusing it passes."""
INTERESTING = [None, "", "abc", -1, 0, 1, 3, 53, "53", 2**31, 2**63, 1e10, -1e300, 0.5, True,
               [], {}, [1, 2], {"a": 1}, "../outside", "/etc/passwd", "a" * 10000]


def _files(ds: Path) -> list[Path]:
    return sorted(p for p in ds.rglob("*") if p.is_file())


def _choose_file(rng: random.Random, ds: Path) -> Path:
    files = _files(ds)
    weights = []
    for p in files:
        rel = p.relative_to(ds).as_posix()
        weights.append(8 if rel == "manifest.json" else 6 if rel.endswith(".index.npz") else
                       3 if rel.endswith(".jsonl") else 2 if rel.startswith("shards/") else 1)
    return rng.choices(files, weights)[0]


def mutate_bytes(rng: random.Random, path: Path) -> str:
    data = bytearray(path.read_bytes())
    op = rng.choice(["flip", "flip", "flip8", "truncate", "extend", "zero", "empty"])
    if op == "empty" or not data:
        path.write_bytes(b"")
        return "emptied"
    if op == "flip":
        i = rng.randrange(len(data))
        data[i] ^= 1 << rng.randrange(8)
        desc = f"bit flip at byte {i}"
    elif op == "flip8":
        picks = [rng.randrange(len(data)) for _ in range(8)]
        for i in picks:
            data[i] = rng.randrange(256)
        desc = f"8 random bytes at {picks}"
    elif op == "truncate":
        n = rng.choice([len(data) // 2, len(data) - 1, rng.randrange(len(data)), 1])
        del data[n:]
        desc = f"truncated to {n} bytes"
    elif op == "extend":
        n = rng.choice([1, 512, 4096, 100_000])
        data += bytes(rng.randrange(256) for _ in range(min(n, 4096))) * max(1, n // 4096)
        desc = f"extended by {n} bytes"
    else:
        i = rng.randrange(len(data))
        n = min(len(data) - i, rng.choice([1, 16, 512, 8192]))
        data[i:i + n] = bytes(n)
        desc = f"{n} zero bytes at {i}"
    path.write_bytes(bytes(data))
    return desc


def _json_paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _json_paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:8]):
            yield from _json_paths(v, prefix + (i,))


def _get(obj, path):
    for k in path:
        obj = obj[k]
    return obj


def _inject_path(rng: random.Random, value: str, outside: Path) -> str:
    base = os.path.basename(str(value)) or "x"
    return rng.choice([f"../outside/{base}", str(outside / base), f"shards/../../outside/{base}",
                       f"/{base}", f"{value}/../../../outside/{base}", "shards/.", ""])


def mutate_json(rng: random.Random, path: Path, outside: Path) -> str:
    try:
        obj = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        return mutate_bytes(rng, path)
    paths = [p for p in _json_paths(obj) if p]
    important = [p for p in paths if any(k in p for k in (
        "classes", "splits", "path", "num_samples", "shards", "format", "schema_version",
        "normalization", "max_pixels", "sha256", "size", "class_counts", "index_sha256"))]
    target = rng.choice(important if important and rng.random() < 0.8 else paths)
    parent, key = _get(obj, target[:-1]), target[-1]
    old = parent[key]
    op = rng.choice(["delete", "value", "value", "path", "swap", "nest", "rename"])
    if op == "delete" and isinstance(parent, dict):
        del parent[key]
        desc = f"deleted {'.'.join(map(str, target))}"
    elif op == "path" and isinstance(old, str):
        parent[key] = _inject_path(rng, old, outside)
        desc = f"{'.'.join(map(str, target))} = {parent[key]!r}"
        if key == "path" and parent[key] not in ("", "shards/."):
            desc += " " + OUTSIDE_TAG
    elif op == "swap" and isinstance(parent, dict) and len(parent) > 1:
        other = rng.choice([k for k in parent if k != key])
        parent[key], parent[other] = parent[other], parent[key]
        desc = f"swapped {'.'.join(map(str, target))} with {other}"
    elif op == "nest":
        deep = "[" * 100_000 + "]" * 100_000
        text = json.dumps(obj).replace(json.dumps(old), deep, 1) if old is not None else None
        if text and text != json.dumps(obj):
            path.write_text(text)
            return f"{'.'.join(map(str, target))} nested 100000 deep"
        parent[key] = INTERESTING[0]
        desc = f"{'.'.join(map(str, target))} = null"
    elif op == "rename" and isinstance(parent, dict):
        new = rng.choice(["../evil", "a/b", "", "..", "train", "val", "x" * 300])
        parent[new] = parent.pop(key)
        desc = f"renamed key {'.'.join(map(str, target))} -> {new!r}"
    else:
        parent[key] = rng.choice(INTERESTING)
        if parent[key] == "../outside":
            parent[key] = _inject_path(rng, str(old), outside)
        desc = f"{'.'.join(map(str, target))} = {str(parent[key])[:40]!r}"
        if key == "path" and isinstance(parent[key], str) and (
                "outside" in parent[key] or parent[key].startswith("/")):
            desc += " " + OUTSIDE_TAG
    path.write_text(json.dumps(obj))
    return desc


def mutate_npz(rng: random.Random, path: Path) -> str:
    if rng.random() < 0.3:
        return mutate_bytes(rng, path)
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception:
        return mutate_bytes(rng, path)
    name = rng.choice(sorted(arrays))
    a = arrays[name]
    op = rng.choice(["value", "value", "value", "dtype", "shape", "drop", "pickle", "dup"])
    if op == "value" and len(a):
        i = rng.randrange(len(a))
        if a.dtype.kind in "iu":
            a = a.copy()
            v = rng.choice([-1, 99, 2**31 - 1, int(a.max()) + 1, 0, 10**12])
            a[i] = np.array(v).astype(a.dtype) if a.dtype.kind == "u" and v < 0 else v
            desc = f"{name}[{i}] = {a[i]}"
        elif a.dtype.kind == "S":
            a = a.copy()
            a[i] = rng.choice([b"", b"../x", a[(i + 1) % len(a)], b"\xff\xfe"])
            desc = f"{name}[{i}] = {a[i]!r}"
        else:
            return mutate_bytes(rng, path)
    elif op == "dtype":
        a = a.astype(rng.choice([np.float64, np.int8, "U5", np.bool_]))
        desc = f"{name} as {a.dtype}"
    elif op == "shape":
        a = rng.choice([a[:-1], np.concatenate([a, a[:1]]), a.reshape(-1, 1), a[:0]])
        desc = f"{name} shape {a.shape}"
    elif op == "drop":
        del arrays[name]
        desc = f"dropped {name}"
        a = None
    elif op == "dup" and len(a) > 1:
        a = a.copy()
        a[1] = a[0]
        desc = f"{name}[1] = {name}[0]"
    else:
        a = np.array([{"x": 1}] * len(a), dtype=object)
        desc = f"{name} as a pickled object array"
    if a is not None:
        arrays[name] = a
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return desc


def mutate_jsonl(rng: random.Random, path: Path) -> str:
    lines = path.read_bytes().splitlines()
    if not lines or rng.random() < 0.2:
        return mutate_bytes(rng, path)
    i = rng.randrange(len(lines))
    op = rng.choice(["field", "field", "deep", "drop", "dup", "garbage", "huge"])
    if op == "field":
        try:
            rec = json.loads(lines[i])
        except ValueError:
            return mutate_bytes(rng, path)
        key = rng.choice(sorted(rec))
        rec[key] = rng.choice(INTERESTING)
        lines[i] = json.dumps(rec).encode()
        desc = f"line {i}: {key} = {str(rec[key])[:40]!r}"
    elif op == "deep":
        lines[i] = b"[" * 100_000 + b"]" * 100_000
        desc = f"line {i} nested 100000 deep"
    elif op == "drop":
        del lines[i]
        desc = f"line {i} deleted"
    elif op == "dup":
        lines.insert(i, lines[i])
        desc = f"line {i} duplicated"
    elif op == "huge":
        lines[i] = b'{"key": "' + b"x" * 20_000_000 + b'"}'
        desc = f"line {i} of 20 MB"
    else:
        lines[i] = b"\xff\xfe not json"
        desc = f"line {i} not JSON"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return desc


def mutate_tree(rng: random.Random, ds: Path, outside: Path) -> str:
    """Whole-file mutations: delete, a folder or a symlink out in a file's place, a copy of
    another file of the same kind in its place."""
    victim = _choose_file(rng, ds)
    rel = victim.relative_to(ds).as_posix()
    op = rng.choice(["delete", "dir", "symlink", "swap"])
    if op == "delete":
        victim.unlink()
        return f"deleted {rel}"
    if op == "dir":
        victim.unlink()
        victim.mkdir()
        return f"{rel} replaced by a folder"
    if op == "symlink":
        target = outside / victim.name  # made by _home: its snapshot is taken before this
        if not target.exists():
            shutil.copyfile(victim, target)
        victim.unlink()
        victim.symlink_to(target)
        return f"{rel} replaced by a symlink to a copy outside the dataset"
    same = [p for p in _files(ds) if p != victim and p.suffix == victim.suffix]
    if not same:
        victim.unlink()
        return f"deleted {rel}"
    other = rng.choice(same)
    shutil.copyfile(other, victim)
    return f"{rel} replaced by a copy of {other.relative_to(ds).as_posix()}"


def mutate(rng: random.Random, ds: Path, outside: Path) -> str:
    if rng.random() < 0.12:
        return mutate_tree(rng, ds, outside)
    path = _choose_file(rng, ds)
    rel = path.relative_to(ds).as_posix()
    if path.suffix == ".json":
        return f"{rel}: {mutate_json(rng, path, outside)}"
    if path.suffix == ".npz":
        return f"{rel}: {mutate_npz(rng, path)}"
    if path.suffix == ".jsonl":
        return f"{rel}: {mutate_jsonl(rng, path)}"
    return f"{rel}: {mutate_bytes(rng, path)}"


# --------------------------------------------------------------------------- running
def pixel_hash(image) -> str:
    return hashlib.sha1(np.ascontiguousarray(np.asarray(image)).tobytes()).hexdigest()[:16]


def read_truth(ds: Path, size: int = 48) -> dict:
    """Every split's ``{index: [label, pixel hash]}`` as the eval loader serves it."""
    from shardkit.stream import make_loader

    truth = {}
    for split in SPLITS:
        seen = {}
        with make_loader(ds, split, 8, train=False, num_workers=0, image_size=size,
                         return_meta=True) as loader:
            for images, labels, meta in loader:
                for j, i in enumerate(meta["index"].tolist()):
                    assert i not in seen, (split, i)
                    seen[i] = [int(labels[j]), pixel_hash(images[j])]
        truth[split] = {str(k): v for k, v in sorted(seen.items())}
    return truth


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}


def CliRunner():
    from click.testing import CliRunner as Runner

    return Runner()


def run_command(runner, args: list[str]) -> dict:
    from shardkit.cli import main

    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = runner.invoke(main, ["-q", *args], catch_exceptions=True)
    out = result.output
    problems = []
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        tb = "".join(traceback.format_exception(result.exception))
        problems.append(f"raised {type(result.exception).__name__}: "
                        f"{str(result.exception)[:200]} | {tb[-600:]}")
    if "Traceback" in out:
        problems.append("traceback in the output")
    if result.exit_code not in (0, 1, 2):
        problems.append(f"exit {result.exit_code}")
    if result.exit_code == 2:
        errors = [line for line in out.splitlines() if line.startswith("Error:")]
        if len(errors) != 1:
            problems.append(f"exit 2 with {len(errors)} 'Error:' lines")
    return {"args": args[0] if args[0] != "cache" else "cache build", "exit": result.exit_code,
            "problems": problems, "tail": out.strip().splitlines()[-1][:200] if out.strip() else "",
            "seconds": round(time.perf_counter() - start, 3)}


def run_loader(ds: Path, truth: dict, size: int, splits=SPLITS, cache: str = "none") -> dict:
    from shardkit.errors import ShardkitError
    from shardkit.stream import make_loader

    problems, raised, start = [], None, time.perf_counter()
    for split in splits:
        seen = {}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with make_loader(ds, split, 8, train=False, num_workers=0, image_size=size,
                                 return_meta=True, cache=cache) as loader:
                    for images, labels, meta in loader:
                        for j, i in enumerate(meta["index"].tolist()):
                            seen.setdefault(str(i), []).append(
                                [int(labels[j]), pixel_hash(images[j])])
        except ShardkitError as e:
            raised = f"{split}: {type(e).__name__}: {str(e)[:160]}"
            continue
        except Exception as e:  # anything else is a crash: the rule says a ShardkitError
            problems.append(f"loader {split} raised {type(e).__name__}: {str(e)[:200]} | "
                            + traceback.format_exc()[-600:])
            continue
        want = truth[split]
        if set(seen) != set(want) or any(len(v) != 1 for v in seen.values()):
            problems.append(f"loader {split}: served {sum(map(len, seen.values()))} samples "
                            f"({len(set(seen) - set(want))} unknown, "
                            f"{len(set(want) - set(seen))} missing, "
                            f"{sum(len(v) > 1 for v in seen.values())} repeated) of "
                            f"{len(want)}, without an error")
        else:
            bad = [i for i, v in seen.items() if v[0] != want[i]]
            if bad:
                labels = sum(seen[i][0][0] != want[i][0] for i in bad)
                problems.append(f"loader {split}: {len(bad)} samples differ from the packed "
                                f"ones ({labels} in their label), without an error")
    return {"args": "loader", "problems": problems, "raised": raised,
            "seconds": round(time.perf_counter() - start, 3)}


def _home(number: int, base: Path, work: Path) -> tuple[Path, Path, Path]:
    home = work / f"m{number}"
    shutil.rmtree(home, ignore_errors=True)
    ds, outside = home / "ds", home / "outside"
    shutil.copytree(base, ds, symlinks=True)
    outside.mkdir()
    for p in _files(base):  # identical copies: reading one outside would "work"
        shutil.copyfile(p, outside / p.name)
    (outside / "passwd").write_text("root:x:0:0\n")
    return home, ds, outside


def dataset_mutant(rng, home: Path, ds: Path, outside: Path, truth: dict, size: int) -> tuple:
    """A mutated dataset: every command and the loader."""
    mutation = mutate(rng, ds, outside)
    runner = CliRunner()
    results = [run_command(runner, ["verify", str(ds)]), run_loader(ds, truth, size),
               run_command(runner, ["check", str(ds), "--no-transforms"]),
               run_command(runner, ["stats", str(ds), "--split", "train"]),
               run_command(runner, ["inspect", str(ds), "--split", "train", "--n", "2",
                                    "--out", str(home / "inspect")]),
               run_command(runner, ["cache", "build", str(ds), "--split", "val", "--cache",
                                    f"disk:{home / 'cache'}", "--no-progress",
                                    "--num-workers", "0"]),
               run_command(runner, ["export", str(ds)])]
    problems = []
    verify, loader = results[0], results[1]
    if verify["exit"] == 0 and (loader["raised"] or loader["problems"]):
        problems.append(f"verify said OK but the loader did not serve the packed samples "
                        f"({loader['raised'] or loader['problems'][0][:120]})")
    if OUTSIDE_TAG in mutation and verify["exit"] == 0:
        problems.append("verify said OK on a dataset whose manifest names a file outside its "
                        "folder")
    return mutation, results, problems


def cache_mutant(rng, home: Path, ds: Path, outside: Path, truth: dict, size: int) -> tuple:
    """A disk cache of the val split, filled from the intact dataset, then mutated: the loader
    over it serves the packed pixels or raises, and ``cache build`` ends with a verdict."""
    cache = home / "cache"
    runner = CliRunner()
    first = run_command(runner, ["cache", "build", str(ds), "--split", "val", "--cache",
                                 f"disk:{cache}", "--no-progress", "--num-workers", "0"])
    files = sorted(p for p in cache.rglob("*") if p.is_file())
    if first["exit"] != 0 or not files:
        return "cache: not built", [first], [f"cache build of an intact dataset: exit "
                                             f"{first['exit']} ({first['tail']})"]
    victim = rng.choice(files)
    mutation = f"cache {victim.relative_to(cache).as_posix()}: {mutate_bytes(rng, victim)}"
    results = [run_loader(ds, truth, size, ("val",), cache=f"disk:{cache}"),
               run_command(runner, ["cache", "build", str(ds), "--split", "val", "--cache",
                                    f"disk:{cache}", "--no-progress", "--num-workers", "0"]),
               run_loader(ds, truth, size, ("val",), cache=f"disk:{cache}")]
    return mutation, results, []


def checkpoint_mutant(rng, home: Path, ds: Path, outside: Path, truth: dict, size: int,
                      checkpoint: Path) -> tuple:
    """A mutated training checkpoint at ``train --resume``: a verdict or one Error line."""
    import torch

    bad = home / "resume.pt"
    shutil.copyfile(checkpoint, bad)
    if rng.random() < 0.4:
        mutation = f"checkpoint: {mutate_bytes(rng, bad)}"
    else:
        ckpt = torch.load(bad, weights_only=True)
        key = rng.choice(sorted(ckpt))
        op = rng.choice(["delete", "value", "value"])
        if op == "delete":
            del ckpt[key]
            mutation = f"checkpoint: deleted {key}"
        else:
            ckpt[key] = rng.choice(INTERESTING[:16] + [torch.zeros(3)])
            mutation = f"checkpoint: {key} = {str(ckpt[key])[:30]!r}"
        torch.save(ckpt, bad)
    results = [run_command(CliRunner(), [
        "train", "--data", str(ds), "--out", str(home / "run"), "--config", "cpu-smoke",
        "--model", "test_resnet", "--image-size", "32", "--batch-size", "8", "--epochs", "1",
        "--max-steps", "1", "--num-workers", "0", "--warmup-steps", "0", "--resume", str(bad)])]
    return mutation, results, []


def run_mutant(number: int, seed: int, bases: dict, work: Path) -> dict:
    rng = random.Random(f"{seed}:{number}")
    fmt = rng.choice(sorted(f for f in bases if f != "checkpoint"))
    base = Path(bases[fmt]["path"])
    truth = json.loads(Path(bases[fmt]["truth"]).read_text())
    size = int(bases[fmt]["image_size"])
    home, ds, outside = _home(number, base, work)
    kind = rng.random()
    cwd = os.getcwd()
    os.chdir(home)  # commands that write a default output folder write it here, not in tests/
    try:
        before_outside = snapshot(outside)
        before_home = sorted(p.name for p in home.iterdir())
        if kind < 0.06 and "checkpoint" in bases:
            fmt = "checkpoint"
            mutation, results, problems = checkpoint_mutant(
                rng, home, ds, outside, truth, size, Path(bases["checkpoint"]["path"]))
        elif kind < 0.16:
            mutation, results, problems = cache_mutant(rng, home, ds, outside, truth, size)
        else:
            mutation, results, problems = dataset_mutant(rng, home, ds, outside, truth, size)
    finally:
        os.chdir(cwd)
    problems = [f"{r['args']}: {p}" for r in results for p in r["problems"]] + problems
    if snapshot(outside) != before_outside:
        problems.append("a file outside the dataset folder was written")
    extra = sorted(set(p.name for p in home.iterdir()) - set(before_home)
                   - {"inspect", "cache", "run", "resume.pt"})
    if extra:
        problems.append(f"written beside the dataset: {extra}")
    summary = {r["args"]: r.get("exit", r.get("raised") and "raised" or "ok") for r in results}
    shutil.rmtree(home, ignore_errors=True)
    return {"mutant": number, "format": fmt, "mutation": mutation, "results": summary,
            "seconds": {r["args"]: r["seconds"] for r in results}, "problems": problems}


def main(argv: list[str]) -> int:
    bases_file, work, first, count, seed, report = argv
    bases = json.loads(Path(bases_file).read_text())
    work = Path(work)
    logging.disable(logging.CRITICAL)
    import shardkit.cli  # noqa: F401  (imports before the first mutant: errors here are ours)

    with open(report, "a", buffering=1) as out:
        for number in range(int(first), int(first) + int(count)):
            out.write(json.dumps({"start": number}) + "\n")
            out.flush()
            os.fsync(out.fileno())
            with contextlib.redirect_stderr(io.StringIO()):
                done = run_mutant(number, int(seed), bases, work)
            out.write(json.dumps({"done": done}) + "\n")
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "--truth":
        ds = Path(sys.argv[2])
        Path(sys.argv[3]).write_text(json.dumps(read_truth(ds, int(sys.argv[4]))))
        sys.exit(0)
    sys.exit(main(sys.argv[1:]))
