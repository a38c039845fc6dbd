"""NVIDIA DALI's CPU pipeline on the same ImageFolder (see common.py).

Usage (in DALI's own venv, see README.md)::

    /tmp/dali-venv/bin/python benchmarks/peers/peer_dali.py SRC

``fn.readers.file`` (shuffled) -> ``fn.decoders.image_random_crop`` (libjpeg-turbo, decodes only
the random crop window; DALI's default area 0.08..1 and aspect 3/4..4/3) -> ``fn.resize`` to
224x224 -> ``fn.flip`` with a coin flip: uint8 HWC batches of 64 on the CPU, ``--workers``
threads (``device_id=None``: no GPU used). An epoch is ``ceil(N / 64)`` runs of 64 images
(the reader wraps around at the end, so up to 63 images of the next epoch are counted).
"""
from __future__ import annotations

import os

from nvidia.dali import fn, pipeline_def, types

from common import BATCH, IMAGE_SIZE, list_images, parse_args, time_epochs


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
