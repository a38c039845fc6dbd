"""FFCV on the same ImageFolder (see common.py): its own .beton file, then its Loader.

Usage (in FFCV's own venv, see README.md)::

    MODE=jpg /tmp/ffcv-venv/bin/python benchmarks/peers/peer_ffcv.py SRC WORK

``DatasetWriter`` stores every image with ``RGBImageField(write_mode=MODE, max_resolution=512,
jpeg_quality=90)``, ``MODE`` from the environment (default ``jpg``): ``jpg`` re-encodes at
quality 90 (not the original bytes), ``raw`` stores decoded pixels. A first JSON line reports
the write time and the file size. The ``Loader`` uses ``RandomResizedCropRGBImageDecoder``
(224, 224) + ``RandomHorizontalFlip`` + ``ToTensor`` + ``ToTorchImage``: uint8 (N, 3, 224, 224)
batches, ``OrderOption.RANDOM``, ``os_cache=True``, ``drop_last=False``, ``--workers`` threads.
"""
from __future__ import annotations

import os
import time

from ffcv.fields import IntField, RGBImageField
from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
from ffcv.loader import Loader, OrderOption
from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage
from ffcv.writer import DatasetWriter
from PIL import Image

from common import BATCH, IMAGE_SIZE, emit, list_images, parse_args, time_epochs


class _Folder:
    """Indexed (PIL RGB image, label) pairs, as FFCV's writer takes them."""

    def __init__(self, files):
        self.files = files

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        path, label = self.files[i]
        return Image.open(path).convert("RGB"), label


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    mode = os.environ.get("MODE", "jpg")
    _, files = list_images(args.src)
    os.makedirs(args.work, exist_ok=True)
    path = os.path.join(args.work, f"ffcv_{mode}.beton")
    start = time.perf_counter()
    fields = {"image": RGBImageField(write_mode=mode, max_resolution=512, jpeg_quality=90),
              "label": IntField()}
    DatasetWriter(path, fields, num_workers=max(1, args.workers)).from_indexed_dataset(
        _Folder(files))
    emit({"pipeline": f"ffcv_{mode}", "write_s": round(time.perf_counter() - start, 1),
          "bytes": os.path.getsize(path)}, args.out)
    pipelines = {"image": [RandomResizedCropRGBImageDecoder((IMAGE_SIZE, IMAGE_SIZE)),
                           RandomHorizontalFlip(), ToTensor(), ToTorchImage()],
                 "label": [IntDecoder(), ToTensor(), Squeeze()]}
    loader = Loader(path, batch_size=BATCH, num_workers=args.workers, order=OrderOption.RANDOM,
                    drop_last=False, os_cache=True, pipelines=pipelines)
    time_epochs(f"ffcv_{mode}", lambda: sum(len(y) for _, y in loader), args,
                "uint8 (N, 3, 224, 224)")


if __name__ == "__main__":
    main()
