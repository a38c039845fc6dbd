"""``shardkit bench``: sweep loader settings, time them against a step, say what to change.

Writes ``OUT/bench.json`` (every row, the environment, the recommendation), PNG plots, and prints
a table. Exit status 1 when any row errored (its message is in the table and the JSON); 2 with
one ``Error:`` line when it cannot run (:mod:`shardkit.cli_common`).
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import click

from shardkit.bench.augment import parse_augments
from shardkit.bench.env import EXPECT_PIL_CHOICES, collect_environment
from shardkit.bench.grid import (expand_grid, parse_backends, parse_caches, parse_int_list,
                                 parse_mode)
from shardkit.bench.plots import write_plots
from shardkit.bench.report import format_table, recommend, write_json
from shardkit.bench.runner import (RunConfig, add_augment_ratios, add_auto_rows,
                                   add_baseline_rows, add_cache_ratios, auto_row_count,
                                   dataset_info, format_auto, run_rows)
from shardkit.bench.steps import ModelStep, NoStep, SleepStep, Step, resolve_device
from shardkit.cli_common import (PROGRESS_OPTION, CommaList, alias_help, dataset_arg,
                                 dataset_argument, decoder_choice, flattened, joined,
                                 one_line_errors, progress_default)
from shardkit.formats import FORMATS
from shardkit.errors import ConfigError, ShardkitError

__all__ = ["bench_command", "run_bench", "decoder_availability"]


def decoder_availability(names: list[str]) -> dict[str, str]:
    """``name -> reason`` for each decoder in ``names`` that cannot run here.

    Uses ``shardkit.decode.DECODERS`` (name -> class with ``available()``) when present.

    Raises:
        ConfigError: a name is not in the registry (the message lists the registered ones).
    """
    try:
        from shardkit import decode
    except ImportError as exc:
        return {n: f"shardkit.decode is not importable ({exc})" for n in names if n != "auto"}
    registry = getattr(decode, "DECODERS", None)
    if registry is None:
        return {}
    out = {}
    for n in names:
        if n == "auto":
            continue
        if n not in registry:
            raise ConfigError(f"decoder={n!r}; expected 'auto' or one of {sorted(registry)}")
        try:
            decode.get_decoder(n)
        except ShardkitError as exc:  # e.g. "decoder 'nvjpeg' is not available: CUDA ..."
            out[n] = str(exc)
    return out


def _make_step(step_ms: float | None, model: str | None, device: str, num_classes: int) -> Step:
    if step_ms is not None and model is not None:
        raise ConfigError(f"--step-ms {step_ms} and --model {model} both given; pick one")
    dev = resolve_device(device)
    if model is not None:
        return ModelStep(model, num_classes, dev)
    if step_ms is not None:
        return SleepStep(step_ms, dev)
    return NoStep()


def run_bench(data: list[str], out: str | Path, *, formats: tuple[str, ...] = (),
              decoders: tuple[str, ...] = ("auto",),
              num_workers: str = "0,1,2,4", prefetch_factor: str = "2,4,8",
              pin_memory: str = "both", persistent_workers: str = "off",
              backends: str = "thread", caches: str = "none", augments: str = "none",
              cfg: RunConfig = RunConfig(),
              step_ms: float | None = None,
              model: str | None = None, device: str = "auto", baseline: str = "none",
              expect_pil: str = "any", tolerance: float = 0.05, threshold: float = 0.10,
              plots: bool = True, echo=click.echo, progress: bool = False,
              auto: bool = True) -> dict:
    """The whole ``shardkit bench`` run; returns the ``bench.json`` payload (also written).

    ``backends``: comma list of ``make_loader`` backends (``"thread"``, ``"process"``), each run
    over the same grid; see :func:`shardkit.bench.grid.expand_grid` for the N/A rules.
    ``caches``: comma list of decoded-cache modes (``none``, ``ram``, ``auto``, ``disk:DIR``),
    each run over the same grid; a cached row is timed after one untimed fill epoch
    (:mod:`shardkit.bench.runner`).
    ``augments``: the ``--augment`` value (:func:`shardkit.bench.augment.parse_augments`: presets
    and spec files comma-separated, or one inline YAML op list alone), each run over the same
    grid; augmented rows get ``ratio_to_none``, the baseline the matching torchvision pipeline.
    ``echo``: prints the summary, and a line on stderr per row as it starts (None: silent).
    ``progress``: also a tqdm bar of the rows done, on stderr.
    ``auto``: also time ``num_workers="auto"``, ``prefetch_factor="auto"`` beside the grid
    (:func:`shardkit.bench.runner.add_auto_rows`: one row per backend, cache, augment...,
    with its ratio to the best grid row and to the default), in ``bench.json``'s ``auto``.

    Raises:
        ConfigError: bad option values (named in the message).
        ManifestError: a ``data`` folder is not a packed dataset.
    """
    _check_verdict_options(baseline, tolerance, threshold)
    infos = _select_datasets(data, formats, cfg.split)
    grid = GridOptions.parse(num_workers, prefetch_factor, pin_memory, persistent_workers,
                             backends, caches, augments, train=cfg.train)
    decoders = tuple(dict.fromkeys(decoders))
    unavailable = decoder_availability(list(decoders))
    step = _make_step(step_ms, model, device, len(infos[0]["classes"]))
    env = collect_environment(expect_pil=expect_pil, decoders=list(decoders))
    rows = grid.rows(infos, decoders, unavailable)
    ran = _decoders_ran(env, decoders)
    t0 = time.perf_counter()
    todo = sum(r.status == "run" for r in rows) + (auto_row_count(rows) if auto else 0)
    lines = _RowLines(echo, todo, progress) if echo else None
    try:
        results = _measure(rows, infos[0], cfg, step, baseline, ran, lines)
        auto_rows = add_auto_rows(results, cfg, step, progress=lines) if auto else []
    finally:
        if lines is not None:
            lines.close()
    rec = recommend(results, step.info(), tolerance=tolerance, threshold=threshold)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plot_files = (write_plots(results, out, threshold=threshold, step=step.info())
                  if plots else [])
    config = {"data": [i["root"] for i in infos], "formats": [i["format"] for i in infos],
              "split": cfg.split, "batch_size": cfg.batch_size, "image_size": cfg.image_size,
              "warmup": cfg.warmup, "batches": cfg.batches, "repeats": cfg.repeats,
              "train": cfg.train, "decoders": list(decoders), "backends": grid.backends,
              "caches": grid.caches, "augments": grid.augments, "num_workers": grid.workers,
              "prefetch_factor": grid.prefetch, "pin_memory": pin_memory,
              "persistent_workers": persistent_workers, "baseline": baseline,
              "expect_pil": expect_pil, "tolerance": tolerance,
              "data_bound_threshold": threshold}
    payload = {
        "created_by": f"shardkit {env['shardkit']}",
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": sys.argv,
        "config": config,
        "step": step.info(),
        "environment": env,
        "rows": results,
        "auto": auto_rows,
        "recommendation": rec,
        "plots": plot_files,
        "elapsed_s": time.perf_counter() - t0,
    }
    write_json(out / "bench.json", payload)
    if echo:
        _echo_summary(echo, results, env, rec, out, plot_files, auto_rows)
    return payload


def _check_verdict_options(baseline: str, tolerance: float, threshold: float) -> None:
    """Raises ConfigError for a ``baseline`` other than none / imagefolder, a ``tolerance``
    outside [0, 1) or a data-bound ``threshold`` outside (0, 1]."""
    if baseline not in ("none", "imagefolder"):
        raise ConfigError(f"baseline={baseline!r}; expected 'none' or 'imagefolder'")
    if not 0 <= tolerance < 1:
        raise ConfigError(f"tolerance={tolerance}; expected 0 <= tolerance < 1")
    if not 0 < threshold <= 1:
        raise ConfigError(f"data_bound_threshold={threshold}; expected 0 < threshold <= 1")


def _select_datasets(data: list[str], formats: tuple[str, ...], split: str) -> list[dict]:
    """:func:`dataset_info` of each ``data`` folder, only those of ``formats`` when given.

    Raises:
        ManifestError: a folder is not a packed dataset.
        ConfigError: a format no folder has, or a folder without ``split``.
    """
    infos = [dataset_info(d) for d in data]
    if formats:
        missing = set(formats) - {i["format"] for i in infos}
        if missing:
            raise ConfigError(f"--format {sorted(missing)} requested but no --data folder has that "
                              f"format (given: {[(i['root'], i['format']) for i in infos]})")
        infos = [i for i in infos if i["format"] in formats]
    for i in infos:
        if split not in i["splits"]:
            raise ConfigError(f"split {split!r} not in {i['root']}; available: "
                              f"{sorted(i['splits'])}")
    return infos


@dataclass(frozen=True)
class GridOptions:
    """The parsed grid options of a bench run: lists of ``num_workers``, ``prefetch_factor``
    (None: the default), pin-memory and persistent-workers modes, backends, cache modes and
    augment specs; every combination is a row (:func:`shardkit.bench.grid.expand_grid`)."""

    workers: list
    prefetch: list
    pins: list
    pers: list
    backends: list
    caches: list
    augments: list

    @classmethod
    def parse(cls, num_workers: str, prefetch_factor: str, pin_memory: str,
              persistent_workers: str, backends: str, caches: str, augments: str, *,
              train: bool) -> GridOptions:
        """Parses the CLI's option strings. Raises ConfigError naming the option, and for an
        augment spec with ``train=False`` (evaluation never augments)."""
        grid = cls(workers=parse_int_list(num_workers, "--num-workers"),
                   prefetch=parse_int_list(prefetch_factor, "--prefetch-factor", minimum=1,
                                           allow_none=True),
                   pins=parse_mode(pin_memory, "--pin-memory"),
                   pers=parse_mode(persistent_workers, "--persistent-workers"),
                   backends=parse_backends(backends, "--backend"),
                   caches=parse_caches(caches, "--cache"),
                   augments=parse_augments(augments, "--augment"))
        if not train and grid.augments != ["none"]:
            raise ConfigError(f"--augment {augments} with --eval: evaluation never augments; "
                              f"drop --eval or use --augment none")
        return grid

    def rows(self, infos: list[dict], decoders: tuple[str, ...],
             unavailable: dict[str, str]) -> list:
        """The grid's rows for ``infos``' datasets (pinning N/A without CUDA)."""
        import torch

        return expand_grid([(i["root"], i["format"]) for i in infos], list(decoders),
                           self.workers, self.prefetch, self.pins, self.pers,
                           pin_available=torch.cuda.is_available(),
                           unavailable_decoders=unavailable, backends=self.backends,
                           caches=self.caches, augments=self.augments)


def _decoders_ran(env: dict, decoders: tuple[str, ...]) -> dict:
    """Requested decoder -> the name of the decoder that ran (None when unknown); each one that
    is not what was asked (``"auto"`` aside) is added to ``env["mismatches"]``."""
    ran = {d: env["shardkit_decode"].get("decoders", {}).get(d, {}).get("name") for d in decoders}
    for d, name in ran.items():
        if d != "auto" and name is not None and name != d:
            env["mismatches"].append(f"decoder {d!r} was requested but {name!r} ran")
    return ran


class _RowLines:
    """The ``progress`` callback of :func:`shardkit.bench.runner.run_rows`: each row's line on
    stderr as it starts, and with ``bar`` a tqdm bar (on stderr) of the rows done; ``total``
    counts the grid's rows to run (baseline rows, known later, are added as they start)."""

    def __init__(self, echo, total: int, bar: bool):
        from tqdm import tqdm

        self.echo = echo
        self.started = 0
        self.bar = tqdm(total=total, desc="bench", unit="row", file=sys.stderr) if bar else None

    def __call__(self, message: str) -> None:
        if self.bar is None:
            self.echo(message, err=True)
        else:
            if self.started:
                self.bar.update(1)  # the previous row is done
            if self.started >= self.bar.total:
                self.bar.total = self.started + 1
                self.bar.refresh()
            self.bar.write(message, file=sys.stderr)
        self.started += 1

    def close(self) -> None:
        if self.bar is not None:
            if self.started:
                self.bar.update(1)
            self.bar.close()


def _measure(rows: list, info: dict, cfg: RunConfig, step: Step, baseline: str, ran: dict,
             progress) -> list[dict]:
    """Times every row, then the ImageFolder baseline rows of ``info``'s dataset (``baseline``
    ``"imagefolder"``), and adds the cache, baseline and augment ratios and each shardkit row's
    ``decoder_ran``."""
    results = run_rows(rows, cfg, step, progress=progress)
    add_cache_ratios(results)
    if baseline == "imagefolder":
        results += add_baseline_rows(results, info, cfg, step, progress=progress)
    add_augment_ratios(results)
    for r in results:
        if r["kind"] == "shardkit":
            r["decoder_ran"] = ran.get(r["setting"]["decoder"])
    return results


def _echo_summary(echo, results: list[dict], env: dict, rec: dict, out: Path,
                  plot_files: list[str], auto_rows: list[dict] = ()) -> None:
    """Prints the table, the auto rows, the environment mismatches, the PIL / TurboJPEG / CPU
    line, the recommendation and what was written."""
    echo(format_table(results))
    if auto_rows:
        echo(format_auto(auto_rows))
    for m in env["mismatches"]:
        echo(f"WARNING (environment mismatch): {m}")
    pil, tj = env["pil"], env["turbojpeg"]
    echo(f"PIL {pil['version']} ({'SIMD' if pil['simd'] else 'stock'}, libjpeg-turbo "
         f"{pil['libjpeg_turbo']}); TurboJPEG {tj.get('libjpeg_turbo')} at "
         f"{tj.get('library_path')}; {env['cpu']['usable_cores']} cores "
         f"({env['cpu']['model']})")
    echo(rec["text"])
    echo(f"wrote {out / 'bench.json'}"
         + (f" and {', '.join(plot_files)}" if plot_files else ""))


def _data_arg(ctx, param, values) -> tuple:
    """``--data`` values (the old spelling of DATASET), each as :func:`dataset_arg` takes it."""
    return tuple(dataset_arg(ctx, param, v) for v in values)


_LIST = dict(multiple=True, metavar="LIST")
"""A list option: a comma list, repeatable (the occurrences are joined)."""


@click.command("bench")
@dataset_argument(nargs=-1)
@click.option("--data", "data", multiple=True, callback=_data_arg, metavar="DATASET",
              help=alias_help("the DATASET argument") + " Repeatable.")
@click.option("--split", default="train", show_default=True, help="The split read.")
@click.option("--out", default="bench-results", show_default=True, type=click.Path(file_okay=False),
              help="Folder the results are written to: bench.json and the plots.")
@click.option("--format", "formats", type=CommaList(click.Choice(sorted(FORMATS))),
              callback=flattened, multiple=True,
              help="Only the datasets of these formats [default: every DATASET].")
@click.option("--decoder", "decoders", type=CommaList(decoder_choice()), callback=flattened,
              default=("auto",), show_default=True, multiple=True,
              help="Decoders, each run over the grid (auto: the fastest that runs here).")
@click.option("--backend", "backends", default=("thread",), show_default=True, callback=joined,
              **_LIST,
              help="Loader backends: thread (decoding threads in this process), process "
                   "(DataLoader worker processes); e.g. thread,process compares them.")
@click.option("--cache", "caches", default=("none",), show_default=True, callback=joined,
              **_LIST,
              help="Decoded-cache modes: none, ram, auto, disk:DIR (e.g. none,ram compares "
                   "them). A cached row is timed after one untimed epoch that fills it; its "
                   "size, hit rate and fill time are in the table and bench.json.")
@click.option("--augment", "augments", default=("none",), show_default=True, callback=joined,
              **_LIST,
              help="Augment presets or spec files: none, light, standard, randaugment, "
                   "trivialaugment, FILE.yaml (e.g. none,randaugment compares them); or one "
                   "inline YAML op list, alone. Each augmented row gets its ratio to "
                   "augment=none and its own recommendation; the ImageFolder baseline runs the "
                   "matching torchvision transforms (none for an op list).")
@click.option("--num-workers", default=("0,1,2,4",), show_default=True, callback=joined, **_LIST,
              help="Decoding threads or worker processes (see --backend).")
@click.option("--prefetch-factor", default=("2,4,8",), show_default=True, callback=joined,
              **_LIST,
              help="Batches in flight per worker or thread; 'none' = the default (2). N/A with "
                   "num_workers=0.")
@click.option("--pin-memory", type=click.Choice(["on", "off", "both"]), default="both",
              show_default=True, help="Pinned host memory for the transfer: on, off or both "
              "(N/A without a CUDA device).")
@click.option("--persistent-workers", type=click.Choice(["on", "off", "both"]), default="off",
              show_default=True, is_flag=False, flag_value="on",
              help="Keep worker processes between epochs: on, off or both (bare flag = on). "
                   "N/A with num_workers=0 and with the thread backend.")
@click.option("--batch-size", default=32, show_default=True, type=click.IntRange(min=1),
              help="Images per batch.")
@click.option("--image-size", default=224, show_default=True, type=click.IntRange(min=8),
              help="Square output side in pixels.")
@click.option("--warmup", default=2, show_default=True, type=click.IntRange(min=0),
              help="Batches per repeat excluded from timing.")
@click.option("--batches", default=20, show_default=True, type=click.IntRange(min=1),
              help="Timed batches per repeat (at most).")
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(min=1),
              help="Timed repeats of each row (the table shows their median).")
@click.option("--step-ms", type=click.FloatRange(min=0), default=None,
              help="Simulate a training step of this many ms (CPU sleep, GPU sleep on CUDA).")
@click.option("--model", default=None, help="Real timm model step instead, e.g. hrnet_w18_small.")
@click.option("--device", default="auto", show_default=True,
              help="Device of the step: auto, cpu, cuda or cuda:N.")
@click.option("--baseline", type=click.Choice(["none", "imagefolder"]), default="none",
              show_default=True, help="Also time torchvision ImageFolder+PIL on the source files.")
@click.option("--expect-pil", type=click.Choice(EXPECT_PIL_CHOICES), default="any",
              show_default=True, help="Flag a mismatch when another PIL is loaded.")
@click.option("--tolerance", default=0.05, show_default=True, type=float,
              help="Recommend the cheapest setting within this fraction of the best throughput.")
@click.option("--data-bound-threshold", default=0.10, show_default=True, type=float,
              help="A setting is data-bound when the step waits for data at least this fraction "
                   "of the time.")
@click.option("--eval", "eval_mode", is_flag=True, help="Time the eval transform (train=False).")
@click.option("--auto/--no-auto", "auto", default=True, show_default=True,
              help="Also time num_workers=auto, prefetch_factor=auto beside the grid (one row "
                   "per backend, cache and augment; its ratio to the best grid row).")
@PROGRESS_OPTION
@one_line_errors
def bench_command(dataset, data, split, out, formats, decoders, backends, caches, augments,
                  num_workers, prefetch_factor, pin_memory, persistent_workers, batch_size,
                  image_size, warmup, batches, repeats, step_ms, model, device, baseline,
                  expect_pil, tolerance, data_bound_threshold, eval_mode, auto, progress):
    """Benchmark the loader over a settings grid on each DATASET (a packed folder, or the URL
    of a wds dataset in object storage; several for several formats): is training data-bound,
    and what to change.

    A LIST option takes a comma list and may be repeated: --decoder roi,pil is --decoder roi
    --decoder pil. Every combination of the lists is a row. A line on stderr names each row as
    it starts; a bar counts the rows when stderr is a terminal (--progress / --no-progress).

    Exit 1 when a row errored; 2 with one "Error: ..." line when the bench cannot run (a bad
    option, a folder that is no dataset, a store that cannot be reached)."""
    data = tuple(str(d) for d in dataset + data)
    if not data:
        raise click.UsageError("Missing argument 'DATASET...': the packed dataset to read.")
    cfg = RunConfig(split=split, batch_size=batch_size, image_size=image_size, warmup=warmup,
                    batches=batches, repeats=repeats, train=not eval_mode)
    payload = run_bench(list(data), out, formats=formats, decoders=decoders,
                        num_workers=num_workers, prefetch_factor=prefetch_factor,
                        pin_memory=pin_memory, persistent_workers=persistent_workers,
                        backends=backends, caches=caches, augments=augments, cfg=cfg,
                        step_ms=step_ms, model=model, device=device, baseline=baseline,
                        expect_pil=expect_pil, tolerance=tolerance,
                        threshold=data_bound_threshold, progress=progress_default(progress),
                        auto=auto)
    errors = [r["id"] for r in payload["rows"] if r["status"] == "error"]
    if errors:
        raise click.ClickException(f"{len(errors)} row(s) failed: {errors} (see the notes above "
                                   f"and {Path(out) / 'bench.json'})")
