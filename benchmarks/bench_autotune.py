"""``num_workers="auto"`` against every fixed setting of ``shardkit bench``'s grid, same run.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_autotune.py --data /tmp/flowers-wds

For each simulated training step (none: a fast consumer; 20 ms and 80 ms of ``time.sleep`` in
the consumer loop, as ``shardkit bench --step-ms``), every setting of the grid (``num_workers``
0, 1, 2, 4 x ``prefetch_factor`` 2, 4, 8, as ``shardkit bench``'s default; pin_memory only
matters with CUDA and is off here) and ``auto`` (``num_workers="auto"``,
``prefetch_factor="auto"``) are timed in rows interleaved within each repeat: a fresh loader
per row and repeat, ``--epochs`` epochs, the wall time from the end of the first ``--warmup``
batches to the last batch. The auto row's time includes its tuning (it starts measuring at its
first batch, as in a training run). Medians over ``--repeats``.

Per step the JSON has each setting's median img/s, ``best_fixed`` (the fastest fixed setting),
``auto_ratio_to_best`` (goal >= 0.95), ``auto_ratio_to_default`` (num_workers=2,
prefetch_factor=2, today's default; goal >= 1.0) and what auto settled on in each repeat.
Defaults: batch 64, 224 px, the train transform (RandomResizedCrop + flip), thread backend.
``--quick`` runs a smaller grid (0/2/4 x 2/8), one repeat and one epoch, for a noisy host.
Writes ``benchmarks/results/autotune-flowers.json`` (``--out``).
"""
from __future__ import annotations

import statistics
import time

import click

from _common import write_json

GRID_WORKERS = (0, 1, 2, 4)
GRID_PREFETCH = (2, 4, 8)
DEFAULT = (2, 2)


def _settings(quick: bool) -> list:
    workers, prefetch = ((0, 2, 4), (2, 8)) if quick else (GRID_WORKERS, GRID_PREFETCH)
    out = []
    for nw in workers:
        for pf in prefetch:
            if nw == 0 and pf != prefetch[0]:
                continue  # prefetch does not apply with num_workers=0: one row
            out.append((nw, pf))
    if DEFAULT not in out:
        out.append(DEFAULT)
    return out + [("auto", "auto")]


def _time_row(data: str, setting: tuple, step_s: float, args: dict) -> dict:
    """One fresh loader, ``epochs`` epochs: img/s after the warm-up batches, and its tuning."""
    from shardkit.stream import WorkerOptions, make_loader

    nw, pf = setting
    loader = make_loader(data, "train", args["batch_size"], image_size=args["image_size"],
                         num_workers=nw, prefetch_factor=pf, seed=0,
                         workers=WorkerOptions(backend=args["backend"]))
    images, seen, t0 = 0, 0, None
    try:
        for epoch in range(args["epochs"]):
            loader.set_epoch(epoch)
            for _, labels in loader:
                seen += 1
                if seen == args["warmup"]:
                    t0 = time.perf_counter()
                elif seen > args["warmup"]:
                    images += len(labels)
                if step_s:
                    time.sleep(step_s)
        wall = time.perf_counter() - t0
        tuning = loader.tuning.as_dict()
    finally:
        loader.close()
    return {"img_s": images / wall, "images": images, "wall_s": wall,
            "tuning": {k: tuning[k] for k in ("num_workers", "prefetch_factor", "settled",
                                              "reason")} if nw == "auto" else None}


def _name(setting: tuple) -> str:
    return "auto" if setting[0] == "auto" else f"nw{setting[0]}-pf{setting[1]}"


@click.command()
@click.option("--data", default="/tmp/flowers-wds", show_default=True)
@click.option("--out", default="benchmarks/results/autotune-flowers.json", show_default=True)
@click.option("--steps-ms", default="0,20,80", show_default=True)
@click.option("--repeats", default=3, show_default=True, type=int)
@click.option("--epochs", default=2, show_default=True, type=int)
@click.option("--warmup", default=2, show_default=True, type=int)
@click.option("--batch-size", default=64, show_default=True, type=int)
@click.option("--image-size", default=224, show_default=True, type=int)
@click.option("--backend", default="thread", show_default=True)
@click.option("--quick", is_flag=True, help="Grid 0/2/4 x 2/8, 1 repeat, 1 epoch.")
def main(data, out, steps_ms, repeats, epochs, warmup, batch_size, image_size, backend, quick):
    from shardkit.stream.tuning import cpu_count

    if quick:
        repeats, epochs = 1, 1
    args = dict(batch_size=batch_size, image_size=image_size, epochs=epochs, warmup=warmup,
                backend=backend)
    settings = _settings(quick)
    result = {"command": "benchmarks/bench_autotune.py", "data": data, "cpus": cpu_count(),
              "config": {**args, "repeats": repeats, "steps_ms": steps_ms, "quick": quick},
              "steps": {}}
    for step_ms in (float(s) for s in steps_ms.split(",")):
        runs: dict[str, list] = {_name(s): [] for s in settings}
        for r in range(repeats):
            order = settings if r % 2 == 0 else settings[::-1]  # interleaved, both directions
            for s in order:
                runs[_name(s)].append(_time_row(data, s, step_ms / 1e3, args))
                click.echo(f"step {step_ms:g} ms repeat {r} {_name(s)}: "
                           f"{runs[_name(s)][-1]['img_s']:.0f} img/s", err=True)
        med = {k: statistics.median(x["img_s"] for x in v) for k, v in runs.items()}
        fixed = {k: v for k, v in med.items() if k != "auto"}
        best = max(fixed, key=fixed.get)
        default = _name(DEFAULT)
        entry = {"median_img_s": med, "best_fixed": best,
                 "auto_ratio_to_best": med["auto"] / fixed[best],
                 "auto_ratio_to_default": med["auto"] / fixed[default],
                 "auto_tuning": [x["tuning"] for x in runs["auto"]],
                 "runs": {k: [round(x["img_s"], 1) for x in v] for k, v in runs.items()}}
        result["steps"][f"{step_ms:g}ms"] = entry
        click.echo(f"step {step_ms:g} ms: auto {med['auto']:.0f} img/s = "
                   f"{entry['auto_ratio_to_best']:.3f}x best fixed ({best} {fixed[best]:.0f}), "
                   f"{entry['auto_ratio_to_default']:.3f}x default ({default} "
                   f"{fixed[default]:.0f}); settled on "
                   f"{[(t['num_workers'], t['prefetch_factor']) for t in entry['auto_tuning']]}")
    write_json(out, result)


if __name__ == "__main__":
    main()
