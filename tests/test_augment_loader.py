"""make_loader(augment=...) on the packed embedded sample: the same augmented batches for any
num_workers, backend or resume point; the device path (run on the CPU: the exact code a GPU
runs) gives the same pixels as the decoding threads; eval refuses augmentation; strength
schedules follow set_epoch; mixup / cutmix mix each batch in the loader into soft targets."""
from __future__ import annotations

import pytest
import torch

from shardkit.errors import ConfigError
from shardkit.stream import WorkerOptions, make_loader

S = 64  # output side: small enough for 2 shared cores, large enough for every op
SPEC = [{"op": "color_jitter", "brightness": 0.4, "contrast": 0.4, "saturation": 0.4,
         "hue": 0.05},
        {"op": "rand_augment", "num_ops": 2, "magnitude": 9},
        {"op": "perspective", "distortion_scale": 0.3, "p": 0.3},
        {"op": "gaussian_blur", "kernel_size": 3, "p": 0.3},
        {"op": "random_erasing", "p": 0.5, "value": [0, 128, 255]}]
MAGNITUDE = {"start": 1, "end": 20, "schedule": "linear", "epochs": 5}


@pytest.fixture(scope="module")
def root(packed_sample):
    return packed_sample("wds")


def _loader(root, augment=SPEC, workers=0, backend="thread", **kw):
    return make_loader(root, "train", 16, image_size=S, num_workers=workers, seed=3,
                       augment=augment, workers=WorkerOptions(backend=backend), **kw)


def _batches(loader, epoch=1, skip=0):
    loader.set_epoch(epoch)
    with loader:
        return [(x.clone(), y.clone()) for k, (x, y) in enumerate(loader) if k >= skip]


def _equal(got, want):
    assert len(got) == len(want)
    for k, ((x, y), (wx, wy)) in enumerate(zip(got, want)):
        assert torch.equal(y, wy), f"batch {k}: labels differ"
        assert torch.equal(x.cpu(), wx), f"batch {k}: {(x.cpu() != wx).sum().item()} values differ"


@pytest.fixture(scope="module")
def reference(root):
    """Epoch 1 on the calling thread (num_workers=0), and the same without augmentation."""
    return _batches(_loader(root)), _batches(_loader(root, augment="none"))


def test_augmentation_changes_the_pixels(reference):
    augmented, plain = reference
    assert len(augmented) == len(plain) >= 8
    for (x, y), (px, py) in zip(augmented, plain):
        assert torch.equal(y, py)  # same order, same crops: only the augmentation differs
        assert x.shape == px.shape == (len(y), 3, S, S) and x.dtype == torch.uint8
        changed = (x != px).flatten(1).any(1)
        assert changed.float().mean() > 0.9, "colour jitter alone changes almost every image"


@pytest.mark.parametrize("backend,workers", [("thread", 1), ("thread", 2), ("process", 1),
                                             ("process", 2)])
def test_same_batches_for_any_num_workers_and_backend(root, reference, backend, workers):
    _equal(_batches(_loader(root, workers=workers, backend=backend)), reference[0])


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_resume_mid_epoch_gives_the_remaining_batches(root, reference, backend):
    first = _loader(root, workers=2, backend=backend)
    first.set_epoch(1)
    with first:
        for k, _ in enumerate(first):
            if k == 2:
                break
        state = first.state_dict()
    assert state["epoch"] == 1 and state["batches_consumed"] == 3
    resumed = _loader(root, workers=1, backend=backend)
    resumed.load_state_dict(state)
    with resumed:
        _equal([(x.clone(), y.clone()) for x, y in resumed], reference[0][3:])


def test_device_path_on_cpu_gives_the_same_pixels(root, reference):
    """Programs carried in the batch and applied with torchvision's tensor ops after the
    transfer (``_augment_on_device``, the GPU code) equal the C fast paths in the threads."""
    loader = _loader(root, workers=2)
    loader.dataset.augment_on_device = True
    loader.augment_device = torch.device("cpu")
    _equal(_batches(loader), reference[0])


def test_eval_loaders_refuse_augmentation(root):
    with pytest.raises(ConfigError, match=r"augment=randaugment on an eval loader \(train=False, "
                                          r"split 'val'\): evaluation never augments"):
        make_loader(root, "val", 8, train=False, image_size=S, augment="randaugment")
    with make_loader(root, "val", 8, train=False, image_size=S, augment="none") as loader:
        assert loader.augment.is_identity and loader.augment_values() == {}


def test_set_epoch_moves_the_schedule(root):
    loader = _loader(root, augment=[{"op": "rand_augment", "magnitude": MAGNITUDE}])
    got = []
    for epoch in (0, 2, 4, 9):
        loader.set_epoch(epoch)
        got.append(loader.augment_values())
    loader.close()
    assert got == [{"0.rand_augment.magnitude": v} for v in (1.0, 10.5, 20.0, 20.0)]


def test_scheduled_magnitude_changes_the_pixels(root):
    """At epoch 0 a scheduled magnitude gives the pixels of its start value, at its last epoch
    those of its end value; both differ from each other on the same samples and draws."""
    def at(magnitude, epoch):
        spec = [{"op": "rand_augment", "num_ops": 2, "magnitude": magnitude}]
        return _batches(_loader(root, augment=spec), epoch=epoch)

    scheduled_first, scheduled_last = at(MAGNITUDE, 0), at(MAGNITUDE, 4)
    _equal(scheduled_first, at(1, 0))
    _equal(scheduled_last, at(20, 4))
    weak_last = at(1, 4)
    differ = sum(int((x != w).flatten(1).any(1).sum()) for (x, _), (w, _) in
                 zip(scheduled_last, weak_last))
    total = sum(len(y) for _, y in weak_last)
    # magnitude-free ops (Identity, AutoContrast, Equalize) leave some samples alike
    assert differ > total // 2, f"{differ} of {total} samples differ"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_augmentation_matches_the_cpu_path(root, reference):
    """augment_device="cuda": torchvision's CUDA kernels; float rounding may move a value by a
    grey level, and a histogram op after it may move more, so the bound is on the whole."""
    got = _batches(_loader(root, workers=2, augment_device="cuda"))
    assert len(got) == len(reference[0])
    same = total = 0
    for (x, y), (wx, wy) in zip(got, reference[0]):
        assert x.is_cuda and x.dtype == torch.uint8 and torch.equal(y, wy)
        same += int((x.cpu() == wx).sum())
        total += wx.numel()
    assert same / total > 0.99, f"{same / total:.4f} of the values agree"


@pytest.mark.parametrize("backend, augment, warns", [
    ("thread", SPEC, True),                # perspective, blur: torch ops in threads
    ("thread", "randaugment", False),      # every primitive has a C kernel
    ("process", SPEC, False),              # DataLoader workers run torch single-threaded
])
def test_torch_ops_in_threads_warn_once(root, caplog, backend, augment, warns):
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with caplog.at_level("WARNING", logger="shardkit.stream"):
            _loader(root, augment=augment, workers=2, backend=backend).close()
    finally:
        torch.set_num_threads(threads)
    hits = [r.getMessage() for r in caplog.records if "intra-op threads" in r.getMessage()]
    assert len(hits) == (1 if warns else 0)
    if warns:
        assert "['perspective', 'gaussian_blur']" in hits[0]  # hue jitter runs in C


def test_eval_refuses_batch_ops_and_cuda_needs_a_gpu(root):
    with pytest.raises(ConfigError, match="evaluation never augments"):
        make_loader(root, "val", 16, train=False, augment=[{"op": "mixup", "alpha": 0.8}])
    for split in ("val", "test"):  # train unset: an eval split by its name refuses them too
        with pytest.raises(ConfigError, match=rf"eval loader \(train unset: '{split}' is an eval "
                                              r"split by its name.*never augments"):
            make_loader(root, split, 16, augment=[{"op": "mixup", "alpha": 0.8},
                                                  {"op": "cutmix", "alpha": 1.0}])
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="augment_device='cuda', but torch sees no CUDA"):
            _loader(root, augment="standard", augment_device="cuda")


# ------------------------------------------------------------------ batch ops: mixup / cutmix
MIX = [{"op": "mixup", "alpha": 0.8}, {"op": "cutmix", "alpha": 1.0}]
MS = 32  # mixing is per batch: a small side keeps four backends x workers cheap


def _mix_loader(root, augment=MIX, workers=0, backend="thread", **kw):
    return make_loader(root, "train", 16, image_size=MS, num_workers=workers, seed=3,
                       augment=augment, workers=WorkerOptions(backend=backend),
                       return_meta=True, **kw)


def _mix_batches(loader, epoch=1):
    loader.set_epoch(epoch)
    with loader:
        return [(x.clone(), y.clone(), m["index"].clone()) for x, y, m in loader]


def _expected_mix(x: torch.Tensor, labels: torch.Tensor, draw, num_classes: int):
    """The mix computed here, independently of shardkit.augment.mix: numpy float32 blend of row
    i with row n-1-i rounded to nearest (timm's FastCollateMixup), or the box pasted from the
    reversed batch; targets lam * one_hot(y) + (1 - lam) * one_hot(y reversed)."""
    import numpy as np

    a = x.numpy().astype(np.float32)
    if draw.box is not None:
        y0, y1, x0, x1 = draw.box
        out = x.numpy().copy()
        out[:, :, y0:y1, x0:x1] = x.numpy()[::-1, :, y0:y1, x0:x1]
    else:
        out = np.rint(a * np.float32(draw.lam) + a[::-1] * np.float32(1 - draw.lam))
        out = out.astype(np.uint8)
    eye = np.eye(num_classes, dtype=np.float32)
    t = draw.lam * eye[labels.numpy()] + (1 - draw.lam) * eye[labels.numpy()[::-1]]
    return torch.from_numpy(np.ascontiguousarray(out)), torch.from_numpy(t.astype(np.float32))


@pytest.fixture(scope="module")
def mixed(root):
    """Epoch 1 with mixup + cutmix on the calling thread, and the same batches unmixed."""
    return (_mix_batches(_mix_loader(root)), _mix_batches(_mix_loader(root, augment="none")))


def test_mixup_cutmix_yield_soft_targets_of_the_mixed_batch(root, mixed):
    """Every batch: float32 (B, 5) targets summing to 1, equal to the lam-weighted one-hot mix of
    the batch's labels with the reversed batch's; images uint8, mixed exactly once with the same
    lam (mixup: rounded blend; cutmix: box of the reversed batch, lam = 1 - box area)."""
    from shardkit.augment import AugmentSpec, BatchMix, mix_rng
    from shardkit.dataset.manifest import load_index

    batches, plain = mixed
    label = torch.from_numpy(load_index(root, "train").label)
    mixer = BatchMix.from_spec(AugmentSpec.parse(MIX).resolved(1, batch=True), 5)
    kinds = set()
    assert len(batches) == len(plain) == 9  # 140 train samples, batch 16
    for b, ((x, t, idx), (px, py, pidx)) in enumerate(zip(batches, plain)):
        assert torch.equal(idx, pidx) and torch.equal(py, label[idx])  # same order and samples
        assert x.dtype == torch.uint8 and x.shape == px.shape == (len(idx), 3, MS, MS)
        assert t.dtype == torch.float32 and t.shape == (len(idx), 5)
        torch.testing.assert_close(t.sum(1), torch.ones(len(idx)), rtol=0, atol=1e-6)
        draw = mixer.draw_batch(mix_rng(3, 1, 0, b), MS, MS)  # (seed, epoch, rank, batch)
        assert 0 < draw.lam < 1
        if draw.box is not None:
            y0, y1, x0, x1 = draw.box
            assert draw.lam == pytest.approx(1 - (y1 - y0) * (x1 - x0) / MS ** 2)
        kinds.add("cutmix" if draw.box is not None else "mixup")
        want_x, want_t = _expected_mix(px, py, draw, 5)
        torch.testing.assert_close(t, want_t, rtol=0, atol=1e-6)
        assert torch.equal(x, want_x), f"batch {b}: {(x != want_x).sum().item()} values differ"
        assert not torch.equal(x, px), f"batch {b} is not mixed"
    assert kinds == {"mixup", "cutmix"}  # switch_prob 0.5: both occur in these 9 batches


@pytest.mark.parametrize("backend,workers", [("thread", 2), ("process", 0), ("process", 2)])
def test_mix_is_the_same_for_any_num_workers_and_backend(root, mixed, backend, workers):
    got = _mix_batches(_mix_loader(root, workers=workers, backend=backend))
    assert len(got) == len(mixed[0])
    for k, ((x, t, i), (wx, wt, wi)) in enumerate(zip(got, mixed[0])):
        assert torch.equal(i, wi) and torch.equal(t, wt), f"batch {k}: targets differ"
        assert torch.equal(x, wx), f"batch {k}: {(x != wx).sum().item()} values differ"


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_resume_mid_epoch_gives_the_same_mixed_batches(root, mixed, backend):
    first = _mix_loader(root, workers=2, backend=backend)
    first.set_epoch(1)
    with first:
        for k, _ in enumerate(first):
            if k == 3:
                break
        state = first.state_dict()
    resumed = _mix_loader(root, workers=1, backend=backend)
    resumed.load_state_dict(state)
    with resumed:
        got = [(x.clone(), y.clone(), m["index"].clone()) for x, y, m in resumed]
    assert len(got) == len(mixed[0]) - 4
    for (x, t, i), (wx, wt, wi) in zip(got, mixed[0][4:]):
        assert torch.equal(i, wi) and torch.equal(t, wt) and torch.equal(x, wx)


def test_mix_after_device_ops_is_applied_once(root):
    """With the per-sample ops carried to the device (the GPU code, run on the CPU) the batch is
    mixed there, after them, once: the same batches as the mix in the decoding threads."""
    spec = [{"op": "color_jitter", "brightness": 0.4, "contrast": 0.4}, *MIX]
    want = _mix_batches(_mix_loader(root, augment=spec))
    loader = _mix_loader(root, augment=spec, workers=2)
    loader.dataset.augment_on_device = True
    loader.augment_device = torch.device("cpu")
    got = _mix_batches(loader)
    assert len(got) == len(want)
    for (x, t, i), (wx, wt, wi) in zip(got, want):
        assert torch.equal(i, wi) and torch.equal(t, wt) and torch.equal(x, wx)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_mix_after_the_cuda_ops_matches_the_cpu_path(root):
    """augment_device="cuda": the per-sample ops and then the mix run on the GPU, once: the
    same soft targets as the CPU path and the pixels within the per-sample ops' rounding."""
    spec = [{"op": "color_jitter", "brightness": 0.4, "contrast": 0.4}, *MIX]
    want = _mix_batches(_mix_loader(root, augment=spec))
    got = _mix_batches(_mix_loader(root, augment=spec, workers=2, augment_device="cuda"))
    assert len(got) == len(want)
    same = total = 0
    for (x, t, i), (wx, wt, wi) in zip(got, want):
        assert x.is_cuda and t.is_cuda and x.dtype == torch.uint8 and torch.equal(i, wi)
        torch.testing.assert_close(t.cpu(), wt, rtol=0, atol=1e-6)
        same += int((x.cpu() == wx).sum())
        total += wx.numel()
    assert same / total > 0.99, f"{same / total:.4f} of the values agree"


def test_batch_ops_are_reported_and_follow_their_schedule(root):
    loader = _mix_loader(root, augment=[
        {"op": "mixup", "alpha": {"start": 0.0, "end": 0.4, "schedule": "step", "epochs": 2}},
        {"op": "cutmix", "alpha": 0.0}])
    assert loader.soft_targets and loader.augment_values() == {
        "0.mixup.alpha": 0.0, "0.mixup.p": 1.0, "1.cutmix.alpha": 0.0, "1.cutmix.p": 1.0}
    loader.set_epoch(0)  # both off at epoch 0: one-hot float targets, images as they are
    x, t, m = next(iter(loader))
    plain = _mix_loader(root, augment="none")
    px, py, _ = next(iter(plain))
    assert t.dtype == torch.float32 and torch.equal(t, torch.eye(5)[py]) and torch.equal(x, px)
    loader.set_epoch(2)
    assert loader.augment_values()["0.mixup.alpha"] == 0.4
    x, t, _ = next(iter(loader))
    assert ((t > 0) & (t < 1)).any()  # mixed from epoch 2 on
    loader.close()
    plain.close()
    assert not make_loader(root, "train", 8, image_size=MS).soft_targets


def test_a_label_outside_the_classes_is_a_label_error(root):
    """The mix builds one-hots from the index labels: one outside [0, K) is named, not a torch
    scatter error."""
    from shardkit.augment import MixDraw
    from shardkit.errors import LabelError

    with _mix_loader(root) as loader:
        x, _, m = next(iter(loader))
        labels = torch.tensor([0, 1, 5, 2])
        with pytest.raises(LabelError, match=r"split 'train': label 5 is outside \[0, 5\)"):
            loader.dataset.mix_batch(x[:4].clone(), labels, MixDraw(0.5, None))
