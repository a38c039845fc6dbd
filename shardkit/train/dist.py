"""Device, AMP and ``torchrun`` (DDP) set-up, and the all-gather that merges evaluations.

Under ``torchrun --nproc_per_node K`` the environment holds ``RANK``, ``LOCAL_RANK`` and
``WORLD_SIZE``; the process group uses NCCL on CUDA and gloo on the CPU. Without them the run is
a single process and no process group is created.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import ConfigError

__all__ = ["DistInfo", "setup_distributed", "teardown_distributed", "resolve_device",
           "resolve_amp", "all_gather_varlen", "barrier"]


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``auto`` -> ``cuda:<local_rank>`` when CUDA is available, else ``cpu``.

    Raises:
        ConfigError: CUDA was asked for but is not available.
    """
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={name!r} but CUDA is not available; use --device cpu")
    if name == "cuda":
        name = f"cuda:{local_rank}"
    return torch.device(name)


def resolve_amp(amp: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for ``amp`` on ``device`` (``None`` = full fp32).

    ``auto``: bf16 on a CUDA device that supports it, fp16 (with a GradScaler) on older CUDA
    devices, off on the CPU (bf16 autocast on the CPU is allowed with ``bf16`` but is slower and
    less accurate on most CPUs). ``fp16`` needs CUDA.

    Raises:
        ConfigError: ``bf16`` on a GPU without bf16, or ``fp16`` on the CPU.
    """
    cuda = device.type == "cuda"
    if amp == "off":
        return None
    if amp == "auto":
        if not cuda:
            return None
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if amp == "bf16":
        if cuda and not torch.cuda.is_bf16_supported():
            raise ConfigError(f"amp=bf16 but {torch.cuda.get_device_name(device)} has no bf16; "
                              "use --amp fp16 or auto")
        return torch.bfloat16
    if not cuda:
        raise ConfigError("amp=fp16 needs a CUDA device; on the CPU use --amp bf16 or off")
    return torch.float16


def setup_distributed(device_name: str) -> tuple[DistInfo, torch.device]:
    """Reads the torchrun environment, initialises the process group, picks the device."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    info = DistInfo(rank, local_rank, world_size)
    device = resolve_device(device_name, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if info.distributed and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend,
                                device_id=device if device.type == "cuda" else None)
    return info, device


def teardown_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def all_gather_varlen(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenates every rank's ``tensor`` (same trailing shape, any length) in rank order.

    The tensor must live on the process group's device (CUDA for NCCL, CPU for gloo). Lengths are
    exchanged first and tensors padded to the longest, so each sample appears exactly once.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return tensor
    world = dist.get_world_size()
    length = torch.tensor([tensor.shape[0]], device=tensor.device, dtype=torch.long)
    lengths = [torch.zeros_like(length) for _ in range(world)]
    dist.all_gather(lengths, length)
    sizes = [int(n.item()) for n in lengths]
    longest = max(sizes)
    padded = tensor.new_zeros((longest, *tensor.shape[1:]))
    padded[: tensor.shape[0]] = tensor
    gathered = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded.contiguous())
    return torch.cat([g[:n] for g, n in zip(gathered, sizes)])
