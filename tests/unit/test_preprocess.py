"""preprocess_into(): torchvision's ImageNet eval transform, within one uint8 step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms

from bls_pipeline.stages.preprocess import IMAGENET_MEAN, IMAGENET_STD, PreprocessSpec, crop_box, preprocess_into

IMAGENET = PreprocessSpec()


def _reference(spec: PreprocessSpec) -> transforms.Compose:
    return transforms.Compose([
        transforms.Resize(spec.resize),
        transforms.CenterCrop(spec.crop),
        transforms.ToTensor(),
        transforms.Normalize(spec.mean, spec.std),
    ])


IMAGENET_REFERENCE = _reference(IMAGENET)  # built once, as the real pipeline does


def _ours(img: Image.Image, spec: PreprocessSpec = IMAGENET) -> np.ndarray:
    out = np.full(spec.input_shape, np.nan, dtype=np.float32)
    preprocess_into(img, spec, out)
    return out


def _assert_matches_torchvision(img: Image.Image, spec: PreprocessSpec, reference) -> None:
    expected = reference(img).numpy()
    actual = _ours(img, spec)
    assert actual.shape == expected.shape == spec.input_shape
    diff = np.abs(actual - expected)
    one_step = 1.0 / (255.0 * min(spec.std)) + 1e-5  # one uint8 step, on the widest channel
    assert diff.max() <= one_step, f"max abs diff {diff.max():.6f} > one uint8 step {one_step:.6f}"
    assert diff.mean() < 1e-3, f"mean abs diff {diff.mean():.6f}"


@pytest.mark.parametrize("size", [(500, 375), (375, 500), (224, 224), (256, 300), (1000, 257)])
def test_matches_torchvision(noise_image, size):
    _assert_matches_torchvision(noise_image(*size, seed=sum(size)), IMAGENET, IMAGENET_REFERENCE)


def test_matches_torchvision_on_large_smooth_image(smooth_image):
    _assert_matches_torchvision(smooth_image(3000, 2000), IMAGENET, IMAGENET_REFERENCE)


# Odd sizes and odd (resize - crop) margins: where int() truncation and round-half-even bite.
ODD_SIZES = [(1001, 999), (333, 500), (257, 1000), (299, 301), (511, 257), (257, 257)]
ODD_SPECS = [PreprocessSpec(), PreprocessSpec(resize=255, crop=224), PreprocessSpec(resize=256, crop=223)]


@pytest.mark.parametrize("spec", ODD_SPECS, ids=lambda s: f"{s.resize}-{s.crop}")
@pytest.mark.parametrize("size", ODD_SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_crop_box_matches_torchvision_rounding(spec, size):
    width, height = size
    # torchvision decides the resized size and the crop offset; read both off its output.
    new_w, new_h = transforms.Resize(spec.resize)(Image.new("L", size)).size
    coords = Image.fromarray(np.arange(new_w * new_h, dtype=np.int32).reshape(new_h, new_w))
    top, left = divmod(int(np.asarray(transforms.CenterCrop(spec.crop)(coords))[0, 0]), new_w)

    sx, sy = width / new_w, height / new_h
    expected = (left * sx, top * sy, (left + spec.crop) * sx, (top + spec.crop) * sy)
    assert crop_box(width, height, spec) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("spec", ODD_SPECS[1:], ids=lambda s: f"{s.resize}-{s.crop}")
@pytest.mark.parametrize("size", [(511, 257), (1001, 999)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_odd_specs_match_torchvision(noise_image, spec, size):
    _assert_matches_torchvision(noise_image(*size, seed=7), spec, _reference(spec))


# Portrait photos (3:4, 2:3, 9:16): the crop box covers a smaller share of the height
# than of the width, which is where the box resize and the full resize can part ways.
@pytest.mark.parametrize("size", [(300, 400), (333, 500), (480, 854)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_matches_torchvision_on_portrait_photos(noise_image, size):
    _assert_matches_torchvision(noise_image(*size, seed=11), IMAGENET, IMAGENET_REFERENCE)


def _vm_kib(field: str) -> int:
    line = next(ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith(f"{field}:"))
    return int(line.split()[1])


def _peak_growth_mib(fn):
    """fn()'s result and how far it raised this process's peak resident memory (MiB). The
    peak (VmHWM) is first reset to the current RSS (Linux: clear_refs "5"), so what earlier
    tests allocated cannot hide a spike."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError as exc:
        pytest.skip(f"cannot reset this process's peak RSS here: {exc}")
    base = _vm_kib("VmHWM")
    out = fn()
    return out, (_vm_kib("VmHWM") - base) / 1024


@pytest.mark.parametrize("size", [(1, 20000), (20000, 1)], ids=["1x20000", "20000x1"])
def test_sliver_is_cheap_and_finite(smooth_image, size):
    img = smooth_image(*size)
    out, peak_growth_mib = _peak_growth_mib(lambda: _ours(img))

    assert out.shape == (3, 224, 224)
    assert np.isfinite(out).all()
    # A full Resize(256) would be 256 x 5,120,000 pixels, and the column-cropped one 224 x
    # 5,120,000 (3.4 GB): resampling the crop box only stays within a few MiB.
    assert peak_growth_mib < 64, f"peak memory grew by {peak_growth_mib:.0f} MiB"
    # The one-pixel axis is stretched: every output line along it is constant.
    axis = 2 if size[0] == 1 else 1
    assert np.ptp(out, axis=axis).max() < 1e-6


def test_writes_into_a_batch_row():
    batch = np.zeros((3, *IMAGENET.input_shape), dtype=np.float32)
    preprocess_into(Image.new("RGB", (300, 260), (255, 255, 255)), IMAGENET, batch[1])
    expected = (1.0 - np.asarray(IMAGENET_MEAN)) / np.asarray(IMAGENET_STD)
    assert np.allclose(batch[1], expected.reshape(3, 1, 1), atol=1e-5)
    assert not batch[0].any() and not batch[2].any()  # neighbours untouched


def test_non_imagenet_spec_normalises_grey_to_constant():
    spec = PreprocessSpec(mean=(0.498, 0.498, 0.498), std=(0.502, 0.502, 0.502))
    out = _ours(Image.new("RGB", (320, 240), (128, 128, 128)), spec)
    expected = (128 / 255 - 0.498) / 0.502
    assert np.allclose(out, expected, atol=1e-6)
    assert not np.allclose(out, _ours(Image.new("RGB", (320, 240), (128, 128, 128))), atol=1e-3)


def test_smaller_crop_spec_gives_its_own_shape():
    spec = PreprocessSpec(resize=160, crop=128)
    assert spec.input_shape == (3, 128, 128)
    assert np.isfinite(_ours(Image.new("RGB", (200, 150), (1, 2, 3)), spec)).all()


def test_rejects_non_rgb_image():
    with pytest.raises(ValueError, match="RGB"):
        preprocess_into(Image.new("L", (300, 300)), IMAGENET, np.empty(IMAGENET.input_shape, np.float32))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"resize": 224, "crop": 256}, "crop <= resize"),
     ({"crop": 0}, "crop <= resize"),
     ({"std": (0.229, 0.0, 0.225)}, "std > 0"),
     ({"std": (0.229, -0.224, 0.225)}, "std > 0"),
     ({"std": (0.5, 0.5)}, "3 values"),
     ({"mean": (0.5, 0.5, 0.5, 0.5)}, "3 values")],
)
def test_spec_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PreprocessSpec(**kwargs)


def test_torch_and_numpy_agree_on_layout():
    # Guards the reference itself: ToTensor is CHW, RGB order, as the classifier expects.
    tensor = IMAGENET_REFERENCE(Image.new("RGB", (256, 256), (255, 0, 0)))
    assert isinstance(tensor, torch.Tensor) and tuple(tensor.shape) == IMAGENET.input_shape
    assert np.allclose(_ours(Image.new("RGB", (256, 256), (255, 0, 0)))[:, 0, 0], tensor[:, 0, 0].numpy(), atol=1e-5)


@pytest.mark.parametrize(("pad", "top"), [("bottom_right", 0), ("centre", 16)])
def test_keep_aspect_fits_and_pads(pad, top):
    from bls_pipeline.stages.preprocess import placement, preprocess_into

    spec = PreprocessSpec(mode="keep_aspect", crop=64, mean=(0.5,) * 3, std=(0.5,) * 3, pad=pad, pad_value=127.5)
    assert placement(200, 100, spec) == ((0.0, 0.0, 200.0, 100.0), (0, top, 64, 32))
    out = np.empty(spec.input_shape, np.float32)
    preprocess_into(Image.new("RGB", (200, 100), (255, 0, 0)), spec, out)
    inside = out[:, top:top + 32, :]
    assert np.allclose(inside[0], 1.0) and np.allclose(inside[1:], -1.0)  # red, normalised
    assert np.allclose(np.delete(out, np.s_[top:top + 32], axis=1), 0.0)  # 127.5 normalised: the padding


def test_a_non_square_input_stretches_to_its_own_size():
    from bls_pipeline.stages.preprocess import preprocess_into

    spec = PreprocessSpec(mode="stretch", crop=48, width=320)
    out = np.empty(spec.input_shape, np.float32)
    preprocess_into(Image.new("RGB", (60, 20), (0, 0, 255)), spec, out)
    assert out.shape == (3, 48, 320) and np.allclose(out[2], (1 - 0.406) / 0.225, atol=1e-5)
