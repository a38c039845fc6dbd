"""What every peer script shares: the workload, the command line, the timing loop, the output.

Standard library only, so each peer's own virtual environment (FFCV, DALI, SPDL) can import it.

The workload (the same for every peer): the images of an ImageFolder tree (``SRC/<class>/*.jpg``),
RandomResizedCrop(224, scale=(0.08, 1), ratio=(3/4, 4/3)) + horizontal flip (p = 0.5), batches of
:data:`BATCH` images, ``--workers`` CPU workers (processes or threads, as the peer works), one
untimed warm-up epoch, then ``--epochs`` timed epochs. Every image of the folder is counted in
every epoch (last partial batch kept).

Output: one JSON object per line on stdout (and appended to ``--out`` when given) with
``pipeline``, ``output`` (what a batch holds), ``images``, ``seconds``, ``img_per_s``, ``workers``,
``epochs``, ``batch``. Compare numbers only within one run on one machine, or as ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import Callable

BATCH = 64
IMAGE_SIZE = 224
EXTENSIONS = (".jpg", ".jpeg")


def parse_args(description: str, *, work: bool = True, pipelines: list[str] | None = None):
    """The peers' common command line; ``WORKERS`` / ``EPOCHS`` env vars set the defaults."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("src", help="ImageFolder tree: SRC/<class>/<image>.jpg")
    if work:
        p.add_argument("work", help="scratch folder for the peer's packed copy (rewritten)")
    if pipelines is not None:
        p.add_argument("pipelines", nargs="*", metavar="PIPELINE",
                       help=f"any of {', '.join(pipelines)} (default: all)")
    p.add_argument("--workers", type=int, default=int(os.environ.get("WORKERS", "2")),
                   help="CPU workers (default: $WORKERS or 2)")
    p.add_argument("--epochs", type=int, default=int(os.environ.get("EPOCHS", "2")),
                   help="timed epochs after the warm-up epoch (default: $EPOCHS or 2)")
    p.add_argument("--out", help="also append the JSON lines to this file")
    args = p.parse_args()
    if args.workers < 0 or args.epochs < 1:
        p.error(f"--workers must be >= 0 and --epochs >= 1, got {args.workers}, {args.epochs}")
    if not os.path.isdir(args.src):
        p.error(f"SRC {args.src!r} is not a folder")
    if pipelines is not None:
        unknown = sorted(set(args.pipelines) - set(pipelines))
        if unknown:
            p.error(f"unknown pipeline(s) {unknown}; choose from {pipelines}")
    return args


def list_images(src: str) -> tuple[list[str], list[tuple[str, int]]]:
    """(class names, [(path, label), ...]) of an ImageFolder tree, both sorted; JPEGs only."""
    classes = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d))
                     and not d.startswith("."))
    files = sorted((os.path.join(src, c, f), label) for label, c in enumerate(classes)
                   for f in os.listdir(os.path.join(src, c))
                   if f.lower().endswith(EXTENSIONS) and not f.startswith("."))
    if not files:
        raise SystemExit(f"no .jpg/.jpeg files in class folders of {src}")
    return classes, files


def emit(row: dict, out: str | None) -> None:
    line = json.dumps(row)
    print(line, flush=True)
    if out:
        with open(out, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def time_epochs(name: str, run_epoch: Callable[[], int], args, output: str, **extra) -> dict:
    """Run one warm-up epoch, then ``args.epochs`` timed ones; emit and return the row.

    ``run_epoch()`` iterates one full epoch and returns the number of images it yielded.
    """
    run_epoch()
    start = time.perf_counter()
    images = sum(run_epoch() for _ in range(args.epochs))
    seconds = time.perf_counter() - start
    row = {"pipeline": name, "output": output, "images": images, "seconds": round(seconds, 2),
           "img_per_s": round(images / seconds, 1), "workers": args.workers,
           "epochs": args.epochs, "batch": BATCH, **extra}
    emit(row, args.out)
    return row
