"""``shardkit train``: the click command (flags override ``--config`` YAML, which overrides the
:class:`~shardkit.train.config.TrainConfig` defaults). Works the same under
``torchrun --nproc_per_node K -m shardkit.cli train ...`` (DDP; NCCL on GPU, gloo on CPU)."""
from __future__ import annotations

import json
import logging
import os

import click

from shardkit.cli_common import one_line_errors

from .config import CHOICES

__all__ = ["train_command"]


def _choice(name: str) -> click.Choice:
    return click.Choice(list(CHOICES[name]))


def _show_notes_on_stderr() -> None:
    """INFO notes on stderr when the command runs on its own (the ``shardkit`` group sets this
    up for every command; see :func:`shardkit.cli.show_notes_on_stderr`)."""
    from shardkit.cli import show_notes_on_stderr

    show_notes_on_stderr(logging.INFO)


@click.command("train")
@click.option("--data", type=click.Path(file_okay=False),
              help="Packed dataset folder (manifest.json), or the URL of a wds dataset in object "
                   "storage (s3://, gs://, https://).")
@click.option("--out", type=click.Path(file_okay=False),
              help="Run folder for checkpoints and metrics.")
@click.option("--config", "config_name", default="default", show_default=True,
              help="YAML in configs/train/ (name) or a path; flags override it.")
@click.option("--model", help="timm model name (random init), e.g. hrnet_w18_small.")
@click.option("--pretrained", type=click.Path(dir_okay=False),
              help="Local checkpoint; tensors whose shapes differ are skipped and reported.")
@click.option("--epochs", type=int, help="Planned epochs (defines the LR schedule).")
@click.option("--max-steps", type=int,
              help="Stop after this many optimizer steps (cuts the run; 0: no limit).")
@click.option("--batch-size", type=int, help="Images per step per process.")
@click.option("--image-size", type=int, help="Square input side in pixels.")
@click.option("--lr", type=float, help="Peak learning rate.")
@click.option("--opt", type=_choice("opt"))
@click.option("--weight-decay", type=float, help="On weights only (not norms or biases).")
@click.option("--warmup-epochs", type=float, help="Linear warmup length in epochs.")
@click.option("--warmup-steps", type=int,
              help="Linear warmup length in steps (wins over --warmup-epochs; 0: no warmup). "
                   "Neither set: 1 epoch, cut to 10% of a schedule it would fill (with a note); "
                   "an explicit warmup not shorter than the schedule is an error.")
@click.option("--label-smoothing", type=float)
@click.option("--clip-grad", type=float, help="Max global gradient L2 norm.")
@click.option("--loss", type=_choice("loss"))
@click.option("--balance", type=_choice("balance"), help="class: class-balanced sampling.")
@click.option("--samples-per-epoch", type=int,
              help="Train samples drawn per epoch, with replacement (default: one pass).")
@click.option("--amp", type=_choice("amp"),
              help="auto: bf16 on capable GPUs, fp16 on older, off on CPU.")
@click.option("--compile/--no-compile", "compile_", default=None, help="torch.compile the model.")
@click.option("--channels-last/--no-channels-last", default=None)
@click.option("--patience", type=int,
              help="Early stop after N evaluations without improvement (0: off; ignored, with a "
                   "note, when there is no val split).")
@click.option("--monitor", type=_choice("monitor"))
@click.option("--mean-std", type=_choice("mean_std"),
              help="dataset: the train split's stats from `shardkit stats`.")
@click.option("--seed", type=int)
@click.option("--device", help="auto | cpu | cuda | cuda:N")
@click.option("--num-workers", type=int, help="DataLoader workers per process.")
@click.option("--prefetch-factor", type=int)
@click.option("--cache", help="Decoded image cache: none | ram | auto | disk:DIR (README: "
              "'Decoded cache: when to use which').")
@click.option("--cache-max-side", type=int,
              help="Cache images resized so the longer side is at most N px.")
@click.option("--cache-eval", type=click.Choice(["pixels", "final"]),
              help="final: eval splits cache their final center crops.")
@click.option("--augment", metavar="SPEC",
              help="Augmentation after crop + flip: none | light | standard | randaugment | "
                   "trivialaugment, a YAML list of ops, or a .yaml file (README: "
                   "'Augmentation').")
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
def train_command(config_name, compile_, **flags):
    """Train a timm classifier (hrnet_w18_small by default) from shards packed by `shardkit pack`.

    Writes RUN/config.yaml, RUN/metrics.json, RUN/checkpoints/{last,best}.pt, RUN/eval/*.json|png
    and TensorBoard scalars in RUN/tb/, then prints a JSON summary on stdout (once, from rank 0
    under torchrun); notes (seeds and TF32 set, warmup cut, no or empty val split...) go to
    stderr. A run that cannot start or stops on bad input (a bad flag, a missing or empty split,
    an unreadable dataset or checkpoint, a diverged loss, an unwritable run folder, a store that
    cannot be reached) exits 2 with one "Error: ..." line on stderr, as every shardkit command
    does.
    """
    from .config import load_config
    from .engine import train

    flags["compile"] = compile_
    _show_notes_on_stderr()
    config = load_config(config_name, **flags)
    metrics = train(config)
    if int(os.environ.get("RANK", "0")) != 0:  # torchrun: every rank returns the same metrics
        return
    summary = {"step": metrics["step"], "stopped": metrics["stopped"], "best": metrics["best"]}
    if "test" in metrics:
        summary["test"] = {k: metrics["test"].get(k) for k in ("top1", "top5", "macro_f1", "loss")
                           if k in metrics["test"]}
    if metrics["history"]:
        summary["last_train"] = metrics["history"][-1]["train"]
    click.echo(json.dumps(summary, indent=2))
