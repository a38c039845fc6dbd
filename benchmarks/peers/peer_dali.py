"""NVIDIA DALI's CPU pipeline on the same ImageFolder (see common.py).

Usage (in DALI's own venv, see README.md)::

    /tmp/dali-venv/bin/python benchmarks/peers/peer_dali.py SRC

``fn.readers.file`` (shuffled) -> ``fn.decoders.image_random_crop`` (libjpeg-turbo, decodes only
the random crop window; DALI's default area 0.08..1 and aspect 3/4..4/3) -> ``fn.resize`` to
224x224 -> ``fn.flip`` with a coin flip: uint8 HWC batches of 64 on the CPU, ``--workers``
threads (``device_id=None``: no GPU used). An epoch is ``ceil(N / 64)`` runs of 64 images
(the reader wraps around at the end, so up to 63 images of the next epoch are counted).

:func:`train_pipeline` is DALI's GPU training pipeline that ``scripts/gpu_check.py`` times
against shardkit (pipeline (e)): the same reader, ``device="mixed"`` decoding (nvJPEG), the
crop, resize, colour jitter and flip on the GPU.
"""
from __future__ import annotations

import os

from nvidia.dali import fn, pipeline_def, types

from common import BATCH, IMAGE_SIZE, list_images, parse_args, time_epochs


def train_pipeline(src: str, files: list[str], labels: list[int], *, batch: int, threads: int,
                   device_id: int | None, size: int = IMAGE_SIZE, jitter: float = 0.4,
                   seed: int = 0):
    """DALI's ImageNet training pipeline on ``src`` (built, not yet run).

    ``fn.readers.file`` (shuffled) -> ``fn.decoders.image_random_crop`` (``device="mixed"``:
    nvJPEG on the GPU ``device_id``; ``"cpu"`` when ``device_id`` is None; area 0.08..1, aspect
    3/4..4/3, decoding only the window) -> ``fn.resize`` to ``size x size`` -> ``fn.color_twist``
    with brightness, contrast and saturation each uniform in ``[1 - jitter, 1 + jitter]`` (timm's
    colour jitter 0.4; DALI's contrast pivots on mid-grey, torchvision's on the image mean; no
    jitter when ``jitter`` is 0) -> ``fn.flip`` with a coin flip.

    Args:
        src: the ImageFolder root; ``files``: paths relative to it; ``labels``: one int each.
        batch: images per batch; threads: DALI CPU threads; size: output side in pixels.

    Returns:
        the built pipeline: outputs ``images`` uint8 ``(N, size, size, 3)`` HWC RGB (on the GPU
        with a ``device_id``) and ``labels`` int32 ``(N, 1)`` on the CPU; reader name
        ``"reader"``.
    """
    gpu = device_id is not None

    @pipeline_def(batch_size=batch, num_threads=max(1, threads), device_id=device_id, seed=seed)
    def pipe():
        jpegs, label = fn.readers.file(file_root=src, files=files, labels=labels,
                                       random_shuffle=True, name="reader")
        images = fn.decoders.image_random_crop(jpegs, device="mixed" if gpu else "cpu",
                                               output_type=types.RGB,
                                               random_area=[0.08, 1.0],
                                               random_aspect_ratio=[3 / 4, 4 / 3])
        images = fn.resize(images, resize_x=size, resize_y=size)
        if jitter:
            lo, hi = 1.0 - jitter, 1.0 + jitter
            images = fn.color_twist(images, brightness=fn.random.uniform(range=[lo, hi]),
                                    contrast=fn.random.uniform(range=[lo, hi]),
                                    saturation=fn.random.uniform(range=[lo, hi]))
        return fn.flip(images, horizontal=fn.random.coin_flip()), label

    p = pipe()
    p.build()
    return p


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], work=False)
    _, files = list_images(args.src)
    rel = [os.path.relpath(path, args.src) for path, _ in files]
    labels = [label for _, label in files]

    @pipeline_def(batch_size=BATCH, num_threads=max(1, args.workers), device_id=None, seed=0)
    def pipe():
        jpegs, label = fn.readers.file(file_root=args.src, files=rel, labels=labels,
                                       random_shuffle=True, name="reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
        images = fn.resize(images, resize_x=IMAGE_SIZE, resize_y=IMAGE_SIZE)
        return fn.flip(images, horizontal=fn.random.coin_flip()), label

    p = pipe()
    p.build()

    def epoch() -> int:
        n = 0
        while n < len(files):
            n += len(p.run()[1])
        return n

    time_epochs("dali_cpu", epoch, args, "uint8 (N, 224, 224, 3)")


if __name__ == "__main__":
    main()
