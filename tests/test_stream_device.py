"""device_decode: workers read bytes and draw crops, each batch is decoded in one batched
``decode_jpeg`` call on the device. On the CPU (``device_decode="cpu"``) the same code runs, so
this is tested everywhere; the CUDA test runs where there is a GPU."""
from __future__ import annotations

import pytest
import torch

from shardkit.errors import ConfigError
from shardkit.stream import make_loader
from helpers import build_split


@pytest.fixture(scope="module")
def photos(sample_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("devdec")
    build_split(sample_dir, out, "wds", [24, 16])
    return out


def _compare(root, device, train):
    kw = dict(num_workers=2, image_size=48, seed=4, train=train, return_meta=True)
    cpu = list(make_loader(root, "train", 8, **kw))
    dev = list(make_loader(root, "train", 8, device_decode=device, **kw))
    assert len(cpu) == len(dev) == 5
    diffs = []
    for (x1, y1, m1), (x2, y2, m2) in zip(cpu, dev):
        assert torch.equal(y1, y2.cpu()) and torch.equal(m1["index"], m2["index"].cpu())
        assert x2.dtype == torch.uint8 and x2.shape == x1.shape == (8, 3, 48, 48)
        assert x2.device.type == torch.device(device).type
        assert x2.is_contiguous(memory_format=torch.channels_last)
        diffs.append((x1.float() - x2.cpu().float()).abs().mean().item())
    return diffs


@pytest.mark.parametrize("train", [True, False])
def test_device_decode_on_cpu_matches_the_fused_path(photos, train):
    """Same samples, labels and crops (the crop RNG is drawn on the CPU exactly as the fused
    path draws it); pixels differ only by resampling (the fused path decodes at a DCT-reduced
    scale, the batched one at full size then resizes): measured mean 0.8-1.6 levels of 255 per
    batch on these photos at 48 px. A wrong crop or flip gives tens of levels."""
    diffs = _compare(photos, "cpu", train)
    assert max(diffs) < 3.0, diffs


def test_device_decode_needs_a_transform_config(photos):
    with pytest.raises(ConfigError, match="device_decode needs a TransformConfig"):
        make_loader(photos, "train", 8, image_size=8, device_decode="cpu",
                    transform=lambda data, rng, out=None: out)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_decode_on_cuda_matches_the_fused_path(photos):
    diffs = _compare(photos, "cuda", True)
    assert max(diffs) < 3.0, diffs


def test_device_decode_process_backend_gives_the_thread_backends_batches(photos):
    """The encoded batch (bytes + crops) crosses from worker processes intact."""
    from shardkit.stream import WorkerOptions

    kw = dict(num_workers=2, image_size=32, seed=2, device_decode="cpu")
    thread = list(make_loader(photos, "train", 8, **kw))
    proc = list(make_loader(photos, "train", 8, workers=WorkerOptions(backend="process"), **kw))
    assert len(thread) == len(proc) == 5
    for (x1, y1), (x2, y2) in zip(thread, proc):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_normalizer_waits_for_batches_made_on_the_current_stream():
    """A batch made on the GPU (device_decode, augment_device, DALI) may still be written by
    kernels queued on the current stream when DeviceNormalizer takes it: its side stream must
    wait for them. A ~0.1 s spin queued before each write makes a missing wait read the
    tensor before its fill (zeros or stale memory), not the filled value."""
    from shardkit.stream import DeviceNormalizer
    from shardkit.transforms import IMAGENET_MEAN, IMAGENET_STD

    values = (255, 7, 128)

    def batches():
        for value in values:
            x = torch.zeros(4, 3, 8, 8, dtype=torch.uint8, device="cuda")
            torch.cuda._sleep(200_000_000)  # GPU cycles on the current stream
            x.fill_(value)
            yield x.contiguous(memory_format=torch.channels_last), torch.zeros(
                4, dtype=torch.long, device="cuda")

    got = [x for x, _ in DeviceNormalizer(batches(), "cuda")]
    torch.cuda.synchronize()
    mean = torch.tensor(IMAGENET_MEAN, device="cuda").view(1, 3, 1, 1) * 255
    std = torch.tensor(IMAGENET_STD, device="cuda").view(1, 3, 1, 1) * 255
    assert len(got) == len(values)
    for x, value in zip(got, values):
        torch.testing.assert_close(x, ((value - mean) / std).expand_as(x))
