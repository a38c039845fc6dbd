"""``shardkit train``: the click command (flags override ``--config`` YAML, which overrides the
:class:`~shardkit.train.config.TrainConfig` defaults). Works the same under
``torchrun --nproc_per_node K -m shardkit.cli train ...`` (DDP; NCCL on GPU, gloo on CPU).

timm ``train.py``'s names are accepted beside shardkit's where the concept is the same:
``-b/--batch-size``, ``--img-size``, ``-j/--workers``, ``--smoothing``, ``--mixup``,
``--cutmix``, ``--aa`` (:mod:`shardkit.train.timm_flags`), ``--pretrained`` (a switch: timm's
pretrained weights), ``--initial-checkpoint FILE``, ``--mean`` / ``--std``,
``--interpolation``, ``--crop-pct``. The dataset is the positional ``DATASET`` (``--data``,
the earlier spelling, still works). The earlier ``--pretrained FILE`` (a checkpoint file after
the switch) runs as ``--initial-checkpoint FILE`` with a deprecation warning.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import click

from shardkit.cli_common import one_line_errors
from shardkit.errors import ConfigError

from .config import CHOICES, INTERPOLATIONS

log = logging.getLogger("shardkit.train")

CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".ckpt", ".tar")
"""File names taken for a checkpoint after ``--pretrained`` (its earlier FILE form)."""

__all__ = ["train_command"]


class _IntOrAuto(click.ParamType):
    """An integer, or ``auto`` (the loader picks; :mod:`shardkit.stream.tuning`)."""

    name = "INTEGER|auto"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"  # any case: the help's metavar shows it as AUTO
        try:
            return int(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is neither an integer nor 'auto'", param, ctx)


def _choice(name: str) -> click.Choice:
    return click.Choice(list(CHOICES[name]))


def _show_notes_on_stderr() -> None:
    """INFO notes on stderr when the command runs on its own (the ``shardkit`` group sets this
    up for every command; see :func:`shardkit.cli.show_notes_on_stderr`)."""
    from shardkit.cli import show_notes_on_stderr

    show_notes_on_stderr(logging.INFO)


def _is_checkpoint(value: str) -> bool:
    return Path(value).suffix.lower() in CHECKPOINT_SUFFIXES or Path(value).is_file()


def resolve_dataset(positional: tuple[str, ...], data: str | None, pretrained: bool | None,
                    initial_checkpoint: str | None) -> tuple[str | None, bool | None, str | None]:
    """``(dataset, pretrained, initial_checkpoint)`` from the command line: the positional
    DATASET or ``--data`` (the same value when both are given). A checkpoint file among the
    positionals after ``--pretrained`` is the earlier ``--pretrained FILE``: it becomes
    ``initial_checkpoint`` (the switch is then off), with a deprecation warning.

    Raises:
        ConfigError: two datasets, or a checkpoint given twice (the message names them).
    """
    rest = list(positional)
    legacy = [v for v in rest if _is_checkpoint(v)] if pretrained else []
    if legacy:
        if len(legacy) > 1 or initial_checkpoint not in (None, legacy[0]):
            raise ConfigError(f"checkpoints {legacy + [initial_checkpoint]}: give one, with "
                              "--initial-checkpoint FILE")
        log.warning("--pretrained %s: a checkpoint file after --pretrained is deprecated; use "
                    "--initial-checkpoint %s (--pretrained is now a switch: timm's pretrained "
                    "weights)", legacy[0], legacy[0])
        rest.remove(legacy[0])
        pretrained, initial_checkpoint = None, legacy[0]
    if len(rest) > 1:
        raise ConfigError(f"expected one DATASET, got {len(rest)}: {rest}")
    if rest and data is not None and rest[0] != data:
        raise ConfigError(f"DATASET {rest[0]!r} and --data {data!r}: give the dataset once")
    return (rest[0] if rest else data), pretrained, initial_checkpoint


@click.command("train")
@click.argument("dataset", nargs=-1, metavar="DATASET")
@click.option("--data", type=click.Path(file_okay=False),
              help="The dataset, as DATASET (the earlier spelling): a packed dataset folder "
                   "(manifest.json), or the URL of a wds dataset in object storage (s3://, "
                   "gs://, https://).")
@click.option("--out", type=click.Path(file_okay=False),
              help="Run folder for checkpoints and metrics.")
@click.option("--config", "config_name", default="default", show_default=True,
              help="YAML in configs/train/ (name) or a path; flags override it.")
@click.option("--model", help="timm model name (random init unless --pretrained), e.g. "
              "hrnet_w18_small.")
@click.option("--pretrained/--no-pretrained", default=None,
              help="Start from timm's pretrained weights of --model (timm downloads them on "
                   "first use); mean/std, interpolation and crop fraction then come from the "
                   "model's pretrained config unless given.")
@click.option("--initial-checkpoint", type=click.Path(dir_okay=False),
              help="Local checkpoint loaded after init (.safetensors or a torch state_dict); "
                   "tensors whose shapes differ are skipped and reported. Mean/std, "
                   "interpolation and crop fraction as with --pretrained.")
@click.option("--epochs", type=int, help="Planned epochs (defines the LR schedule).")
@click.option("--max-steps", type=int,
              help="Stop after this many optimizer steps (cuts the run; 0: no limit).")
@click.option("-b", "--batch-size", type=int, help="Images per step per process.")
@click.option("--img-size", "--image-size", "image_size", type=int,
              help="Square input side in pixels.")
@click.option("--lr", type=float, help="Peak learning rate.")
@click.option("--opt", type=_choice("opt"), help="Optimizer (timm's create_optimizer_v2 name).")
@click.option("--weight-decay", type=float, help="On weights only (not norms or biases).")
@click.option("--warmup-epochs", type=float, help="Linear warmup length in epochs.")
@click.option("--warmup-steps", type=int,
              help="Linear warmup length in steps (wins over --warmup-epochs; 0: no warmup). "
                   "Neither set: 1 epoch, cut to 10% of a schedule it would fill (with a note); "
                   "an explicit warmup not shorter than the schedule is an error.")
@click.option("--smoothing", "--label-smoothing", "label_smoothing", type=float,
              help="Label smoothing, 0 <= x < 1.")
@click.option("--clip-grad", type=float, help="Max global gradient L2 norm.")
@click.option("--loss", type=_choice("loss"),
              help="ce: cross-entropy; weighted-ce: weighted by inverse class frequency; focal: "
                   "focal loss.")
@click.option("--balance", type=_choice("balance"), help="class: class-balanced sampling.")
@click.option("--samples-per-epoch", type=int,
              help="Train samples drawn per epoch, with replacement (default: one pass).")
@click.option("--amp", type=_choice("amp"),
              help="auto: bf16 on capable GPUs, fp16 on older, off on CPU.")
@click.option("--compile/--no-compile", "compile_", default=None, help="torch.compile the model.")
@click.option("--channels-last/--no-channels-last", default=None,
              help="Model and batches in channels-last memory format (faster on GPUs).")
@click.option("--patience", type=int,
              help="Early stop after N evaluations without improvement (0: off; ignored, with a "
                   "note, when there is no val split).")
@click.option("--monitor", type=_choice("monitor"),
              help="Validation metric that picks best.pt and drives early stopping.")
@click.option("--mean-std", type=_choice("mean_std"),
              help="dataset: the train split's stats from `shardkit stats`; model: the model's "
                   "pretrained config; auto: model with --pretrained / --initial-checkpoint, "
                   "else imagenet.")
@click.option("--mean", type=float, nargs=3, default=None, metavar="R G B",
              help="RGB mean on the 0-1 scale (wins over --mean-std; give --std too).")
@click.option("--std", type=float, nargs=3, default=None, metavar="R G B",
              help="RGB std on the 0-1 scale (with --mean).")
@click.option("--interpolation", type=click.Choice(list(INTERPOLATIONS)),
              help="Resize filter [default: the model's pretrained config with --pretrained / "
                   "--initial-checkpoint, else bilinear].")
@click.option("--crop-pct", type=float,
              help="Eval center-crop fraction in (0, 1] [default: as --interpolation; else "
                   "0.875].")
@click.option("--seed", type=int, help="Seed of the shuffle, augmentation and model init.")
@click.option("--device", help="auto | cpu | cuda | cuda:N")
@click.option("-j", "--workers", "--num-workers", "num_workers", type=_IntOrAuto(),
              help="Loader workers per process, or auto [default: auto: measured during the "
                   "first steps, then fixed; the choice and why in metrics.json's tuning].")
@click.option("--prefetch-factor", type=_IntOrAuto(),
              help="Batches each loader worker prepares ahead, or auto [default: auto].")
@click.option("--cache", help="Decoded image cache: none | ram | auto | disk:DIR (docs/cache.md: "
              "which to use when).")
@click.option("--cache-max-side", type=int,
              help="Cache images resized so the longer side is at most N px.")
@click.option("--cache-eval", type=click.Choice(["pixels", "final"]),
              help="final: eval splits cache their final center crops.")
@click.option("--augment", metavar="SPEC",
              help="Augmentation after crop + flip: none | light | standard | randaugment | "
                   "trivialaugment, a YAML list of ops, or a .yaml file "
                   "(docs/augmentation.md).")
@click.option("--aa", metavar="TIMM_AA",
              help="timm's auto-augment string, e.g. rand-m9-mstd0.5-inc1 (RandAugment) or "
                   "augmix-m3-w3: replaces the spec's policy op; what does not map is noted; "
                   "timm's AutoAugment policies (v0, original) are refused.")
@click.option("--mixup", type=float,
              help="Mixup Beta alpha (timm's --mixup; 0: off): sets the spec's mixup op.")
@click.option("--cutmix", type=float,
              help="CutMix Beta alpha (timm's --cutmix; 0: off): sets the spec's cutmix op.")
@click.option("--augment-device", help="Where the per-sample ops run: cpu (decoding threads, "
              "default) or cuda[:N] (batched on the GPU after the transfer).")
@click.option("--overfit-batches", type=int, help="Train on N fixed un-augmented batches.")
@click.option("--eval-every", type=int, help="Evaluate val every N epochs (and at the end).")
@click.option("--checkpoint-every", type=int, help="Write last.pt every N epochs (and at the end).")
@click.option("--resume", type=click.Path(exists=True),
              help="Checkpoint file or run folder (continues step count and LR schedule).")
@click.option("--progress/--no-progress", default=None, help="tqdm bar per epoch.")
@click.option("--sync-timing/--no-sync-timing", default=None,
              help="CUDA: synchronise before and after each step so data_wait_fraction splits "
                   "GPU time exactly (slower). Off: host-side wait only, no extra syncs.")
@click.option("--train-split", help="Split to train on (default: train); must exist.")
@click.option("--val-split",
              help="Split evaluated every --eval-every epochs for early stopping and best.pt. "
                   "Default: 'val' if the dataset has it, else no validation: all epochs run, "
                   "no early stopping, no best.pt, the test split scores the last weights.")
@click.option("--test-split",
              help="Split scored once at the end with best.pt (default: 'test' if present).")
@one_line_errors
def train_command(dataset, config_name, compile_, **flags):
    """Train a timm classifier (hrnet_w18_small by default) on DATASET, packed by `shardkit
    pack` (a folder or a wds URL).

    Writes RUN/config.yaml (the config as it ran: mean/std, crop and the augmentation ops
    resolved), RUN/metrics.json, RUN/checkpoints/{last,best}.pt, RUN/eval/*.json|png and
    TensorBoard scalars in RUN/tb/. On stderr: on the CPU an estimate of the run's time and the
    flags of a smoke run, a line per epoch (val top-1, top-5 with more than 5 classes, macro-F1,
    loss, img/s, data-wait fraction; also with --no-progress, which only hides the bars), and
    which epoch is best (by --monitor) and which is last; notes (seeds and TF32 set, warmup cut,
    no or empty val split...) too. Then a JSON summary on stdout (once, from rank 0 under
    torchrun). A run that cannot start or stops on bad input (a bad flag, a missing or empty
    split, an unreadable dataset or checkpoint, a diverged loss, an unwritable run folder, a
    store that cannot be reached) exits 2 with one "Error: ..." line on stderr, as every
    shardkit command does.
    """
    from .config import load_config
    from .engine import train
    from .report import summary

    flags["data"], flags["pretrained"], flags["initial_checkpoint"] = resolve_dataset(
        dataset, flags["data"], flags["pretrained"], flags["initial_checkpoint"])
    flags["compile"] = compile_
    for name in ("mean", "std"):  # click gives () for an unset nargs=3 option
        flags[name] = list(flags[name]) if flags[name] else None
    _show_notes_on_stderr()
    config = load_config(config_name, **flags)
    metrics = train(config, report=lambda line: click.echo(line, err=True))
    if int(os.environ.get("RANK", "0")) != 0:  # torchrun: every rank returns the same metrics
        return
    click.echo(json.dumps(summary(metrics), indent=2))
