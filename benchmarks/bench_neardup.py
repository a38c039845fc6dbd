"""Near-duplicate search at a million hashes, and the pHash's cost per image.

1. **Search.** ``--n`` (default 1,000,000) synthetic 64-bit hashes: uniform random ones plus
   ``--clusters`` planted clusters of 4 (a centre and copies at 1, 2 and 4 flipped bits, the
   flips disjoint: pairwise distances 1, 2, 4, 3, 5, 6), shuffled in. For each threshold
   :func:`shardkit.images.neardup.near_pairs` (multi-index hashing) is timed (median of ``--repeats``)
   and every planted pair within the threshold must come out, with its distance (asserted).
   Its peak memory at threshold 4 is measured with ``tracemalloc`` (numpy reports its buffers).
2. **All pairs, for scale.** The numpy all-pairs search (XOR + ``np.bitwise_count`` of blocks
   of 256 hashes against every later hash: the upper triangle, the plain numpy way) on the first
   ``--brute-n`` hashes (default 20,000), extrapolated to ``--n`` as n**2; near_pairs on the same
   subsample must give the same pairs.
3. **pHash cost** on ``--photos`` (default the embedded examples/flowers-sample): per image,
   ``decode_rgb`` (the decode ``check`` does), ``check_image`` (pack's full decode check),
   :func:`shardkit.images.neardup.phash64`, ``imagehash.phash`` (the reference it reproduces bit for
   bit, checked on every photo) and :func:`shardkit.images.neardup.degenerate_reason`; median and
   minimum over ``--phash-repeats`` interleaved passes (order reversed every other pass), one
   thread. On a busy machine the minimum is the steadier figure.

Usage::

    .venv/bin/python benchmarks/bench_neardup.py [--n 1000000] [--thresholds 0,2,4,6]
        [--repeats 3] [--phash-repeats 15] [--out benchmarks/results/neardup.json]
"""
from __future__ import annotations

import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import click
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shardkit.images import neardup  # noqa: E402
from shardkit.bench.env import collect_environment  # noqa: E402
from _common import write_json  # noqa: E402

FLIPS = (1, 2, 4)  # bits flipped in the three copies of a planted cluster centre


def make_hashes(n: int, clusters: int, seed: int = 0) -> tuple[np.ndarray, list[np.ndarray]]:
    """``n`` hashes (uniform random, with ``clusters`` planted clusters of 4 shuffled in) and,
    per cluster, the positions of its centre and of its copies at 1, 2 and 4 bits."""
    rng = np.random.default_rng(seed)
    h = rng.integers(0, 2**64, size=n, dtype=np.uint64, endpoint=False)
    perm = rng.permutation(n)[:4 * clusters].reshape(clusters, 4)
    centres = h[perm[:, 0]]
    bits = np.argsort(rng.random((clusters, 64)), axis=1)[:, :sum(FLIPS)]  # distinct bits
    start = 0
    for k, f in enumerate(FLIPS, 1):
        mask = np.zeros(clusters, np.uint64)
        for b in bits[:, start:start + f].T:
            mask |= np.uint64(1) << b.astype(np.uint64)
        h[perm[:, k]] = centres ^ mask
        start += f
    return h, list(perm)


def planted_pairs(perm: list[np.ndarray], t: int) -> dict[tuple[int, int], int]:
    """(i, j) -> distance of the planted pairs within ``t`` bits."""
    dist = {(0, 1): 1, (0, 2): 2, (0, 3): 4, (1, 2): 3, (1, 3): 5, (2, 3): 6}
    out = {}
    for p in perm:
        for (a, b), d in dist.items():
            if d <= t:
                i, j = sorted((int(p[a]), int(p[b])))
                out[(i, j)] = d
    return out


def brute(h: np.ndarray, t: int, rows: int = 256) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All pairs within ``t`` bits: blocks of ``rows`` hashes against every later hash (the
    upper triangle only), XOR + popcount."""
    n = h.size
    out_i, out_j, out_d = [], [], []
    for s in range(0, n, rows):
        d = np.bitwise_count(h[s:s + rows, None] ^ h[None, s:])
        i, j = np.nonzero(d <= t)
        up = j > i  # j is relative to s: later hashes only
        i, j = i[up], j[up]
        out_i.append(i + s)
        out_j.append(j + s)
        out_d.append(d[i, j].astype(np.int64))
    i, j, d = (np.concatenate(x) for x in (out_i, out_j, out_d))
    order = np.lexsort((j, i))
    return i[order], j[order], d[order]


def _timed(fn, repeats: int) -> tuple[float, list[float], object]:
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times, result


def search(n: int, clusters: int, thresholds: list[int], repeats: int, brute_n: int) -> dict:
    h, perm = make_hashes(n, clusters)
    rows = []
    for t in thresholds:
        med, times, (i, j, d) = _timed(lambda t=t: neardup.near_pairs(h, t), repeats)
        found = dict(zip(zip(i.tolist(), j.tolist()), d.tolist()))
        want = planted_pairs(perm, t)
        missed = [p for p, dist in want.items() if found.get(p) != dist]
        assert not missed, f"t={t}: {len(missed)} planted pairs missed, e.g. {missed[:3]}"
        assert (np.bitwise_count(h[i] ^ h[j]) == d).all() and (d <= t).all()
        rows.append({"threshold": t, "blocks": neardup.plan_blocks(n, t),
                     "layout": neardup._layout(neardup.plan_blocks(n, t), t)
                     if neardup.plan_blocks(n, t) else "all pairs",
                     "seconds": round(med, 3), "seconds_all": [round(x, 3) for x in times],
                     "pairs": int(i.size), "planted_pairs": len(want),
                     "other_pairs": int(i.size) - len(want)})
    tracemalloc.start()
    neardup.near_pairs(h, 4)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    sub = h[:brute_n]
    brute_rows = []
    for t in thresholds:
        med_b, _, ref = _timed(lambda t=t: brute(sub, t), 1)
        med_m, _, got = _timed(lambda t=t: neardup.near_pairs(sub, t), max(1, repeats))
        assert all(np.array_equal(a, b) for a, b in zip(ref, got)), f"t={t}: differs from brute"
        brute_rows.append({"threshold": t, "n": brute_n, "brute_seconds": round(med_b, 3),
                           "near_pairs_seconds": round(med_m, 4), "pairs": int(ref[0].size),
                           "brute_extrapolated_seconds": round(med_b * (n / brute_n) ** 2, 1)})
    for r, b in zip(rows, brute_rows):
        r["brute_extrapolated_seconds"] = b["brute_extrapolated_seconds"]
        r["speedup"] = round(b["brute_extrapolated_seconds"] / max(r["seconds"], 1e-9), 1)
    return {"n": n, "planted_clusters": clusters, "rows": rows, "brute_subsample": brute_rows,
            "peak_traced_MB_t4": round(peak / 2**20, 1), "hashes_MB": round(h.nbytes / 2**20, 1)}


def phash_cost(photos: Path, repeats: int) -> dict:
    import imagehash
    from PIL import Image

    from shardkit.doctor.reading import decode_rgb
    from shardkit.images.normalize import check_image

    files = sorted(p for p in photos.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
    datas = [p.read_bytes() for p in files]
    imgs = [decode_rgb(d) for d in datas]
    ref = [int.from_bytes(np.packbits(imagehash.phash(Image.fromarray(x), hash_size=8)
                                      .hash.reshape(-1)).tobytes(), "big") for x in imgs]
    mismatches = sum(neardup.phash64(x) != r for x, r in zip(imgs, ref))

    def per_image_ms(fn, items):
        t0 = time.perf_counter()
        for x in items:
            fn(x)
        return (time.perf_counter() - t0) / len(items) * 1e3

    rows = {
        "decode_rgb": lambda: per_image_ms(decode_rgb, datas),
        "check_image": lambda: per_image_ms(check_image, datas),
        "phash64": lambda: per_image_ms(neardup.phash64, imgs),
        "imagehash_phash": lambda: per_image_ms(
            lambda x: imagehash.phash(Image.fromarray(x), hash_size=8), imgs),
        "degenerate_reason": lambda: per_image_ms(neardup.degenerate_reason, imgs),
    }
    for fn in rows.values():
        fn()  # warm-up
    runs: dict[str, list[float]] = {k: [] for k in rows}
    for r in range(repeats):
        for name, fn in (list(rows.items()) if r % 2 == 0 else list(rows.items())[::-1]):
            runs[name].append(fn())
    med = {k: statistics.median(v) for k, v in runs.items()}
    best = {k: min(v) for k, v in runs.items()}
    shapes = np.array([x.shape[:2] for x in imgs])
    return {"photos": str(photos), "images": len(imgs), "phash_mismatches_vs_imagehash":
            int(mismatches), "median_hw": np.median(shapes, axis=0).tolist(),
            "repeats": repeats, "ms_per_image": {k: round(v, 4) for k, v in med.items()},
            "ms_per_image_min": {k: round(v, 4) for k, v in best.items()},
            "ms_spread": {k: [round(min(v), 4), round(max(v), 4)] for k, v in runs.items()},
            "ratios_to_decode_rgb": {k: round(v / med["decode_rgb"], 3) for k, v in med.items()},
            "ratios_to_decode_rgb_min": {k: round(v / best["decode_rgb"], 3)
                                         for k, v in best.items()},
            "ratios_to_check_image": {k: round(v / med["check_image"], 3)
                                      for k, v in med.items()}}


@click.command()
@click.option("--n", default=1_000_000, show_default=True, type=click.IntRange(2))
@click.option("--clusters", default=10_000, show_default=True, type=click.IntRange(0))
@click.option("--thresholds", default="0,2,4,6", show_default=True,
              help="Comma list of Hamming thresholds (0-64).")
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(1))
@click.option("--brute-n", default=20_000, show_default=True, type=click.IntRange(2))
@click.option("--phash-repeats", default=15, show_default=True, type=click.IntRange(1))
@click.option("--photos", default=str(ROOT / "examples" / "flowers-sample"), show_default=True,
              type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", default=str(ROOT / "benchmarks" / "results" / "neardup.json"),
              show_default=True, type=click.Path(dir_okay=False, path_type=Path))
def main(n, clusters, thresholds, repeats, brute_n, phash_repeats, photos, out):
    """Time near_pairs at N hashes against the all-pairs search, and the pHash per image."""
    ts = [int(x) for x in thresholds.split(",")]
    result = {"search": search(n, clusters, ts, repeats, min(brute_n, n)),
              "phash": phash_cost(photos, phash_repeats),
              "environment": collect_environment()}
    s = result["search"]
    print(f"near_pairs on {s['n']:,} hashes ({s['planted_clusters']:,} planted clusters of 4, "
          f"all planted pairs recovered), median of {repeats}:")
    print(f"  {'t':>2} {'blocks':>6} {'seconds':>8} {'pairs':>8} {'all pairs (extrap.)':>20}"
          f" {'speedup':>8}")
    for r in s["rows"]:
        print(f"  {r['threshold']:>2} {r['blocks']:>6} {r['seconds']:>8.2f} {r['pairs']:>8,}"
              f" {r['brute_extrapolated_seconds']:>18,.0f} s {r['speedup']:>7,.0f}x")
    b = s["brute_subsample"][0]
    print(f"  all pairs measured on {b['n']:,} hashes, x(n/{b['n']:,})^2; peak traced memory "
          f"at t=4: {s['peak_traced_MB_t4']} MB (the hashes: {s['hashes_MB']} MB)")
    p = result["phash"]
    print(f"pHash on {p['images']} photos (median {p['median_hw']} px), "
          f"{p['phash_mismatches_vs_imagehash']} mismatches vs imagehash:")
    print(f"  {'':18s} {'median':>9s} {'min':>9s}  (of {p['repeats']}; x decode_rgb)")
    for k, v in p["ms_per_image"].items():
        print(f"  {k:18s} {v:6.3f} ms {p['ms_per_image_min'][k]:6.3f} ms  "
              f"{p['ratios_to_decode_rgb'][k]:5.2f}x {p['ratios_to_decode_rgb_min'][k]:5.2f}x")
    write_json(out, result)


if __name__ == "__main__":
    main()
