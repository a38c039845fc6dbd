"""The training loop of ``shardkit train``: steps, evaluation, checkpoints, early stopping, logs.

One :class:`Trainer` per process. Under ``torchrun`` every rank runs the same number of steps
(the train loader pads with ``even="pad"``) and evaluation is exactly-once: each rank scores a
disjoint part of the split and the logits and labels of all ranks are all-gathered, so every rank
computes the same metrics over exactly ``manifest.splits[split].num_samples`` samples.

Outputs in ``config.out`` (written by rank 0, each file atomically): ``config.yaml``,
``metrics.json``, ``checkpoints/{last,best}.pt``, ``eval/<split>_*.{json,png}``, ``tb/``
(TensorBoard scalars) and ``pretrained_report.json`` when ``--initial-checkpoint`` is used.
``config.yaml`` is the config as it ran: mean/std, interpolation and crop_pct resolved
(:func:`shardkit.train.data.resolve_data_fields`) and ``augment`` as the op list with every
parameter (:func:`shardkit.train.timm_flags.augment_ops`).

The lines a person reads (the CPU estimate, one per epoch with its val scores, the closing
best / last / test lines; :mod:`shardkit.train.report`) go to the ``report`` callable on rank 0.

Process-wide state is changed only by :func:`train` (the run set-up of ``shardkit train``),
never on import or by building a model: see :func:`shardkit.train.run_setup.setup_process`.
Notes go to the ``shardkit.train`` logger (the CLI shows them on stderr).
"""
from __future__ import annotations

import json
import logging
import math
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist

from ..augment import AugmentSpec
from ..errors import ConfigError, EvalCountError, TrainingDivergedError
from shardkit.storage.atomic import atomic_write_bytes
from .checkpoint import (RESUME_FIELDS, check_resume_classes, check_resume_config,
                         check_run_folder, load_checkpoint, load_parts, resolve_resume,
                         rng_state, save_checkpoint)
from .config import TrainConfig, save_config
from .data import (eval_loader, fixed_batches, make_normalizer, resolve_data_fields,
                   train_loader, transform_config)
from .dist import all_gather_varlen, barrier, resolve_amp, setup_distributed, teardown_distributed
from .metrics import EarlyStopping, classification_metrics, save_eval
from .model import check_labels, initial_model, probe_model, unwrap
from .optim import build_loss, build_optimizer, build_scheduler, resolve_warmup
from .report import epoch_line, estimate_for, final_lines
from .run_setup import resolve_splits, setup_process
from .timm_flags import augment_ops

__all__ = ["train", "Trainer", "resolve_splits", "setup_process"]

log = logging.getLogger("shardkit.train")


def train(config: TrainConfig, report=None) -> dict:
    """Runs one training job (single process, or one rank under torchrun); returns metrics.json.

    ``report``: called with each line a person reads (str; :mod:`shardkit.train.report`) on
    rank 0; default: INFO on the ``shardkit.train`` logger.

    Process-wide side effects (logged at INFO, see :func:`setup_process`): the python, numpy and
    torch global RNGs are seeded with ``config.seed``; on CUDA ``cudnn.benchmark`` is switched on,
    and TF32 matmuls/convolutions on Ampere and newer. Under torchrun the process group is
    created and destroyed.

    Raises:
        ConfigError: missing ``data`` / ``out``, invalid options, resume mismatches.
        ManifestError: ``config.data`` is not a packed dataset.
        LabelError: a label lies outside ``[0, num_classes)``.
        OutputExistsError: ``config.out`` already holds a run and this is not a resume.
    """
    if not config.data or not config.out:
        raise ConfigError(f"data={config.data!r} and out={config.out!r}: both are required "
                          "(shardkit train DATASET --out RUN)")
    info, device = setup_distributed(config.device)
    try:
        trainer = Trainer(config, info, device, report)
        try:
            return trainer.run()
        finally:
            trainer.close()
    finally:
        teardown_distributed()


def _sync(device: torch.device, enabled: bool) -> None:
    if enabled and device.type == "cuda":
        torch.cuda.synchronize(device)


class Trainer:
    """Holds the model, optimiser, loaders and run state of one process."""

    def __init__(self, config: TrainConfig, info, device: torch.device, report=None):
        from shardkit.dataset.manifest import load_manifest

        self.info, self.device = info, device
        self.say = (report or log.info) if info.is_main else (lambda line: None)
        self.out = Path(config.out)
        resume_path = resolve_resume(config.resume) if config.resume else None
        self.resume = (load_checkpoint(resume_path, tuple(RESUME_FIELDS)) if resume_path
                       else None)
        if self.resume is not None:
            check_resume_config(config, self.resume["config"])
        check_run_folder(self.out, resuming=self.resume is not None)
        if config.overfit_batches and config.label_smoothing:
            # smoothing puts the loss floor well above zero, which the overfit check needs
            if info.is_main:
                log.warning("overfit_batches=%d: label_smoothing %s -> 0.0 (saved in "
                            "config.yaml)", config.overfit_batches, config.label_smoothing)
            config = config.replace(label_smoothing=0.0)
        self.config = config
        self.manifest = load_manifest(config.data)
        self.classes = list(self.manifest["classes"])
        if self.resume is not None:
            check_resume_classes(self.resume["classes"], self.classes, config.data)
        self.num_classes = len(self.classes)
        splits = self.manifest["splits"]
        self.val_split, self.test_split = resolve_splits(config, splits, info.is_main)
        self.eval_splits = [s for s in (self.val_split, self.test_split) if s is not None]
        self.process_settings = setup_process(config, device, announce=info.is_main)
        self.amp_dtype = resolve_amp(config.amp, device)
        self.augment, given = AugmentSpec.parse(config.augment), config.augment
        # the config as it runs and as config.yaml records it
        config = self.config = config.replace(**resolve_data_fields(config, self.manifest),
                                              augment=augment_ops(self.augment))
        mean, std = config.mean, config.std
        self.mean_std = {"mean": list(mean), "std": list(std)}
        self.transform = transform_config(config, mean, std)
        tc = self.transform
        self.normalize = make_normalizer(mean, std, device, config.channels_last)
        if config.overfit_batches:
            self.fixed = fixed_batches(config, info, tc)
            self.train_loader = None
            self.steps_per_epoch = len(self.fixed)
        else:
            self.fixed = None
            self.train_loader = train_loader(config, info, tc)
            self.steps_per_epoch = len(self.train_loader)
        self.eval_loaders = {s: eval_loader(config, info, tc, s) for s in self.eval_splits}
        self._build_model()
        self.criterion = build_loss(config, splits[config.train_split]["class_counts"],
                                    self.classes).to(device)
        self.soft_criterion = None
        if self.augment.batch_ops:  # mixup / cutmix: the train loader yields soft targets
            from timm.loss import SoftTargetCrossEntropy

            self.soft_criterion = SoftTargetCrossEntropy()
        self.optimizer = build_optimizer(unwrap(self.model), config)
        self.scheduler = build_scheduler(self.optimizer, config, self.steps_per_epoch)
        _, warmup_note = resolve_warmup(config, self.steps_per_epoch)
        if warmup_note and info.is_main:
            log.warning(warmup_note)
        self.scaler = torch.amp.GradScaler(device.type,
                                           enabled=self.amp_dtype == torch.float16)
        self.step, self.epoch, self.epoch_done, self.epoch_batches = 0, 0, False, 0
        self.best, self.history = None, []
        self.stopper = EarlyStopping(config.monitor, config.patience)
        self.loader_state = None
        if self.resume is not None:
            self._load_resume()
        self.writer = None
        if info.is_main:
            (self.out / "checkpoints").mkdir(parents=True, exist_ok=True)
            save_config(config, self.out / "config.yaml", (
                "shardkit train: the config of this run as resolved (--config reads it back)",
                *([f"augment as given: {given}"] if isinstance(given, str) else [])))
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.out / "tb"))

    # ----------------------------------------------------------------- set-up
    def _build_model(self) -> None:
        config = self.config
        model, self.pretrained_weights, self.pretrained_report = initial_model(
            config, self.num_classes, fresh=self.resume is None, note=self.info.is_main)
        if self.pretrained_report is not None and self.info.is_main:
            atomic_write_bytes(self.out / "pretrained_report.json",
                               json.dumps(self.pretrained_report, indent=2).encode())
        model.to(self.device)
        if config.channels_last:
            model.to(memory_format=torch.channels_last)
        probe_model(model, config.image_size, self.num_classes, self.device)
        self.plain = model
        if self.info.distributed:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.device.index] if self.device.type == "cuda" else None
            model = DDP(model, device_ids=ids)
        if config.compile:
            model = torch.compile(model)
        self.model = model
        self.eval_model = torch.compile(self.plain) if config.compile else self.plain

    def _load_resume(self) -> None:
        ckpt = self.resume
        parts = [("model", self.plain), ("optimizer", self.optimizer),
                 ("scheduler", self.scheduler)] + ([("scaler", self.scaler)]
                                                   if ckpt.get("scaler") else [])
        load_parts(ckpt, parts, self.config.resume)
        self.step, self.epoch, self.epoch_done = ckpt["step"], ckpt["epoch"], ckpt["epoch_done"]
        self.epoch_batches = ckpt["epoch_batches"]
        self.best = ckpt["best"]
        self.stopper = EarlyStopping(self.config.monitor, self.config.patience,
                                     None if self.best is None else self.best["value"],
                                     ckpt["bad_evals"])
        self.history = list(ckpt["history"])
        self.loader_state = ckpt["loader"]

    # ----------------------------------------------------------------- loop
    def run(self) -> dict:
        config = self.config
        stopped = "completed"  # or "max_steps" / "early_stop"; metrics say "running" until the end
        epoch = self.epoch + 1 if (self.resume is not None and self.epoch_done) else self.epoch
        if self.max_steps_reached():
            stopped = "max_steps"
            epoch = config.epochs
        line = (estimate_for(config, self.plain, self.amp_dtype, self.steps_per_epoch, self.step,
                             epoch, self.manifest["splits"], self.val_split, self.test_split)
                if self.device.type == "cpu" and self.info.is_main else None)
        if line:  # on the CPU, before the first step: how long the run will take
            self.say(line)
        while epoch < config.epochs:
            resuming = self.resume is not None and not self.epoch_done and epoch == self.epoch
            train_stats = self.train_epoch(epoch, resuming)
            cut = self.max_steps_reached()
            entry = {"epoch": epoch, "step": self.step, "partial": cut and not self.epoch_done,
                     "train": train_stats}
            last_epoch = epoch == config.epochs - 1 or cut
            new_best = False
            if self.val_split is not None and ((epoch + 1) % config.eval_every == 0
                                               or last_epoch):
                entry["val"] = self.evaluate(self.val_split, f"epoch{epoch:03d}")
                self.history.append(entry)
                new_best = self.track_best(entry)
            else:
                self.history.append(entry)
            self.say(epoch_line(entry, config.monitor, new_best))
            stop = ("max_steps" if cut else "early_stop" if self.stopper.should_stop else None)
            if stop or last_epoch or (epoch + 1) % config.checkpoint_every == 0:
                self.save("last")
            self.write_metrics("running")
            if stop:
                stopped = stop
                break
            epoch += 1
        metrics = self.final_test(stopped)
        for line in final_lines(metrics, config.monitor):
            self.say(line)
        return metrics

    def close(self) -> None:
        """Stops the loaders' decoding threads / worker processes and closes TensorBoard
        (:func:`train` calls it when the run ends or fails)."""
        for loader in [self.train_loader, *self.eval_loaders.values()]:
            if loader is not None and hasattr(loader, "close"):
                loader.close()
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def max_steps_reached(self) -> bool:
        return self.config.max_steps is not None and self.step >= self.config.max_steps

    def _batches(self, epoch: int, resuming: bool):
        """Iterator over what is left of ``epoch`` (all of it unless resuming), and the
        epoch's full length in batches."""
        if self.fixed is not None:
            start = self.epoch_batches if resuming else 0
            return iter(self.normalize(self.fixed[start:])), len(self.fixed)
        loader = self.train_loader
        if resuming:
            loader.load_state_dict(self.loader_state)
        else:
            loader.set_epoch(epoch)
        return iter(self.normalize(loader)), len(loader)

    def train_epoch(self, epoch: int, resuming: bool = False) -> dict:
        """One epoch (or what is left of it after a resume / before max_steps) of steps."""
        from tqdm import tqdm

        config, device = self.config, self.device
        self.model.train()
        self.epoch, self.epoch_done = epoch, False
        batches, total = self._batches(epoch, resuming)
        bar = tqdm(total=total, desc=f"epoch {epoch}", leave=False, dynamic_ncols=True,
                   disable=not (self.info.is_main and config.progress))
        if not resuming:
            self.epoch_batches = 0
        bar.update(self.epoch_batches)
        autocast = (torch.autocast(device.type, dtype=self.amp_dtype) if self.amp_dtype
                    else nullcontext())
        loss_sum, images, wait, compute, done = 0.0, 0, 0.0, 0.0, 0
        start = time.perf_counter()
        sync = config.sync_timing  # see TrainConfig.sync_timing: exact GPU split vs host wait
        while not self.max_steps_reached():
            _sync(device, sync)
            t0 = time.perf_counter()
            try:
                x, y = next(batches)
            except StopIteration:
                self.epoch_done = True
                break
            t1 = time.perf_counter()
            soft = y.is_floating_point()  # mixup / cutmix: mixed by the train loader, once
            if not soft:
                check_labels(y, self.num_classes,
                             f"split {config.train_split!r}, step {self.step}")
            with autocast:
                logits = self.model(x)
            loss = (self.soft_criterion(logits.float(), self._smooth(y)) if soft
                    else self.criterion(logits.float(), y))
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.scale(loss).backward()
            if config.clip_grad:
                self.scaler.unscale_(self.optimizer)
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.clip_grad)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.scheduler.step()
            self.step += 1
            value = float(loss.detach())  # synchronises on CUDA
            if not math.isfinite(value):
                raise TrainingDivergedError(f"train loss is {value} at step {self.step}; "
                                            f"lower --lr (now {config.lr}) or use --clip-grad")
            _sync(device, sync)
            t2 = time.perf_counter()
            wait, compute = wait + (t1 - t0), compute + (t2 - t1)
            loss_sum, images, done = loss_sum + value * y.shape[0], images + y.shape[0], done + 1
            self.epoch_batches += 1
            lr = self.optimizer.param_groups[0]["lr"]
            if self.writer is not None:
                self.writer.add_scalar("train/loss", value, self.step)
                self.writer.add_scalar("train/lr", lr, self.step)
            bar.update(1)
            bar.set_postfix(loss=f"{value:.3f}", lr=f"{lr:.2e}")
        else:
            # cut by max_steps: was this the last batch of the epoch anyway?
            self.epoch_done = self.epoch_batches >= total
        bar.close()
        seconds = time.perf_counter() - start
        self.loader_state = None if self.fixed is not None else self.train_loader.state_dict()
        totals = self._reduce([loss_sum, images, wait, compute, done], [seconds])
        loss_sum, images, wait, compute, done, seconds = totals
        stats = {"loss": loss_sum / images if images else None,  # None, never NaN: no data
                 "lr": self.optimizer.param_groups[0]["lr"],
                 "steps": int(done / self.info.world_size), "images": int(images),
                 "seconds": seconds, "images_per_s": images / seconds if seconds > 0 else None,
                 "data_wait_fraction": wait / (wait + compute) if wait + compute > 0 else None}
        if not images:
            stats["reason"] = "no train batch in this epoch"
        strengths = self.augment.scheduled_values(epoch)
        if strengths:
            stats["augment"] = strengths
        if self.writer is not None:
            for key in ("loss", "images_per_s", "data_wait_fraction"):
                if stats[key] is not None:
                    self.writer.add_scalar(f"epoch/train_{key}", stats[key], epoch)
            for key, value in strengths.items():
                self.writer.add_scalar(f"augment/{key}", value, epoch)
        return stats

    def _smooth(self, targets: torch.Tensor) -> torch.Tensor:
        """``label_smoothing`` on the loader's float32 ``(N, K)`` soft targets:
        ``t * (1 - eps) + eps / K``, what timm's ``mixup_target`` gives (linear in the
        one-hots). The batches are mixed by the train loader (``augment``'s mixup / cutmix,
        batch ``b``'s draw from ``(seed, epoch, rank, b)``); ``overfit_batches`` runs read
        fixed, unmixed batches with int64 labels."""
        eps = self.config.label_smoothing
        return targets if not eps else targets * (1.0 - eps) + eps / self.num_classes

    def _reduce(self, sums: list[float], maxes: list[float]) -> list[float]:
        """Sums ``sums`` and takes the max of ``maxes`` over ranks (identity on one process)."""
        if not self.info.distributed:
            return sums + maxes
        t = torch.tensor(sums, dtype=torch.float64, device=self.device)
        m = torch.tensor(maxes, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
        return t.tolist() + m.tolist()

    # ----------------------------------------------------------------- eval
    @torch.inference_mode()
    def evaluate(self, split: str, name: str) -> dict:
        """Merged metrics of ``split`` over all ranks; rank 0 saves ``eval/<split>_<name>.*``.

        Raises:
            EvalCountError: the merged count differs from the manifest's ``num_samples``.
        """
        model, device = self.eval_model, self.device
        if self.info.distributed:  # BN running stats drift per rank; score rank 0's model
            for buffer in self.plain.buffers():
                dist.broadcast(buffer, src=0)
        model.eval()
        autocast = (torch.autocast(device.type, dtype=self.amp_dtype) if self.amp_dtype
                    else nullcontext())
        all_logits, all_labels = [], []
        for x, y in self.normalize(self.eval_loaders[split]):
            check_labels(y, self.num_classes, f"split {split!r}")
            with autocast:
                all_logits.append(model(x).float())
            all_labels.append(y)
        logits = (torch.cat(all_logits) if all_logits
                  else torch.zeros((0, self.num_classes), device=device))
        labels = torch.cat(all_labels) if all_labels else torch.zeros(0, dtype=torch.long,
                                                                       device=device)
        logits, labels = all_gather_varlen(logits), all_gather_varlen(labels)
        expected = self.manifest["splits"][split]["num_samples"]
        if labels.numel() != expected:
            raise EvalCountError(f"evaluation of {split!r} merged {labels.numel()} samples over "
                                 f"{self.info.world_size} rank(s); the manifest lists {expected}")
        result = classification_metrics(logits, labels, self.classes)
        result["split"], result["step"] = split, self.step
        if self.info.is_main:
            result["files"] = save_eval(result, self.classes, self.out / "eval", f"{split}_{name}")
            for key in ("loss", "top1", "top5", "macro_f1"):
                if result.get(key) is not None:
                    self.writer.add_scalar(f"{split}/{key}", result[key], self.step)
        self.model.train()
        return result

    def track_best(self, entry: dict) -> bool:
        """Updates ``best`` (and best.pt) when ``entry``'s val score improves; returns whether
        it did."""
        monitor = self.config.monitor
        value = entry["val"][monitor]
        if not self.stopper.update(value):
            return False
        self.best = {"monitor": monitor, "value": value, "epoch": entry["epoch"],
                     "step": self.step}
        self.save("best")
        return True

    def final_test(self, stopped: str) -> dict:
        """Evaluates the best checkpoint on the test split (when there is one); writes metrics."""
        test = None
        if self.test_split is not None:
            barrier()
            best = self.out / "checkpoints" / "best.pt"
            if best.exists():  # no val split: no best.pt, the test scores the last weights
                self.plain.load_state_dict(load_checkpoint(best, ("model",))["model"])
            test = self.evaluate(self.test_split, "best" if best.exists() else "last")
            test["weights"] = ({"checkpoint": "best", "epoch": self.best["epoch"]}
                               if best.exists() and self.best else
                               {"checkpoint": "last", "epoch": self.epoch})
        return self.write_metrics(stopped, test)

    # ----------------------------------------------------------------- outputs
    def save(self, which: str) -> None:
        if not self.info.is_main:
            return
        save_checkpoint(self.out / "checkpoints" / f"{which}.pt", {
            "model": self.plain.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
            "epoch": self.epoch, "epoch_done": self.epoch_done, "step": self.step,
            "epoch_batches": self.epoch_batches,
            "loader": self.loader_state, "config": self.config.to_dict(),
            "classes": self.classes, "best": self.best, "bad_evals": self.stopper.bad_evals,
            "history": self.history, "rng": rng_state()})

    def write_metrics(self, stopped: str, test: dict | None = None) -> dict:
        import timm

        metrics = {
            "run": {"model": self.config.model, "num_classes": self.num_classes,
                    "classes": self.classes, "data": str(self.config.data),
                    "device": str(self.device), "world_size": self.info.world_size,
                    "amp": str(self.amp_dtype).replace("torch.", "") if self.amp_dtype else "off",
                    "seed": self.config.seed, "steps_per_epoch": self.steps_per_epoch,
                    "sync_timing": self.config.sync_timing,
                    "mean_std": self.mean_std, "torch": torch.__version__,
                    "timm": timm.__version__, "pretrained": self.pretrained_report,
                    "pretrained_weights": self.pretrained_weights,
                    "transform": self.transform.to_dict(),
                    "augment": self.augment.to_config(), "augment_ops": self.config.augment,
                    "augment_device": (str(self.train_loader.augment_device or "cpu")
                                       if self.train_loader is not None else None)},
            "step": self.step, "stopped": stopped, "best": self.best, "history": self.history,
            "cache": {"train": (self.train_loader.cache_stats() if self.train_loader is not None
                                else None),
                      **{s: loader.cache_stats() for s, loader in self.eval_loaders.items()}},
            # each loader's num_workers / prefetch_factor, "auto" or given, and why
            "tuning": {"train": (self.train_loader.tuning.as_dict()
                                 if self.train_loader is not None else None),
                       **{s: loader.tuning.as_dict() for s, loader in self.eval_loaders.items()}}}
        if test is not None:
            metrics["test"] = test
        if self.info.is_main:
            atomic_write_bytes(self.out / "metrics.json", json.dumps(metrics, indent=2).encode())
        return metrics
