"""The GPU path's pixels (runtime/decode/torch_device.py) against the CPU path's, run here with torch
on the CPU and, where a CUDA GPU is present, on it.

Tolerance, in uint8 steps (one step: 1/255 of the range before mean/std, what one rounding
moves a pixel value):
- torch on the CPU: every value within 1 step, the mean difference at most 0.25 step. Both
  paths decode with libjpeg-turbo and resample with the same antialiased bilinear filter on
  the same geometry; Pillow rounds to uint8 between its horizontal and vertical passes and
  weighs in fixed point, torch resamples in float and rounds once, so a value moves at most
  one step, and only some do (measured: 5-18% of them, mean 0.05-0.18 step).
- CUDA: the mean difference at most 1 step, 99.9% of values within 8. nvjpeg's IDCT and
  chroma upsampling are not libjpeg-turbo's: torchvision's own test lets nvjpeg's decoded
  pixels differ from libjpeg's by up to 2 steps on average; the resize averages neighbours,
  so the preprocessed tensors must agree better than that on average.
FP16 inputs allow 0.25 step more: float16's resolution near the ends of the normalised
range (2^-9, about 0.11 step), met twice in the CPU path, which rounds its product to
float16 before subtracting the mean.
The CPU path is compared with its JPEG draft decode off (draft_min_side=0): the draft
(decoding large JPEGs at 1/2..1/8 scale) is the CPU path's own shortcut, which the GPU does
not need; for ImageNet-size photos it does not apply anyway (checked below).
"""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

torch = pytest.importorskip("torch")

from bls_pipeline.runtime.decode.device import HostDevice  # noqa: E402
from bls_pipeline.runtime.decode.torch_device import TorchDevice  # noqa: E402
from bls_pipeline.stages import torch_preprocess  # noqa: E402
from bls_pipeline.stages.decode import DecodePolicy  # noqa: E402
from bls_pipeline.stages.jpeg_header import gpu_jpeg  # noqa: E402
from bls_pipeline.stages.preprocess import PreprocessSpec  # noqa: E402
from bls_pipeline.tools.bench_images import make_image_set  # noqa: E402

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
FULL = DecodePolicy(draft_min_side=0)
CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="no CUDA GPU visible"))]
# (max of the mean, limit for the 99.9th percentile) in steps, per device (see the docstring).
TOLERANCE = {"cpu": (0.25, 1.0), "cuda": (1.0, 8.0)}
SPECS = {
    "imagenet": PreprocessSpec(),
    "grey_thumbnail": PreprocessSpec(mode="stretch", crop=64, colour="GRAY", layout="NHWC", dtype="UINT8",
                                     mean=(0.0,), std=(1.0,), scale=1.0),
    "bgr_fp16_nhwc": PreprocessSpec(colour="BGR", layout="NHWC", dtype="FP16"),
    "effnet": PreprocessSpec(mean=(0.498,) * 3, std=(0.502,) * 3),
}


def _steps(cpu: np.ndarray, other: np.ndarray, spec: PreprocessSpec) -> np.ndarray:
    diff = np.abs(cpu.astype(np.float32) - np.asarray(other, dtype=np.float32))
    if spec.dtype == "UINT8":
        return diff
    std = np.asarray(spec.std, np.float32)
    return diff * (std.reshape(-1, 1, 1) if spec.layout == "NCHW" else std) / spec.scale


def _assert_close(cpu, other, spec, device) -> None:
    steps = _steps(cpu, other, spec)
    mean_limit, p999_limit = TOLERANCE[device]
    slack = 0.25 if spec.dtype == "FP16" else 1e-3
    assert steps.mean() <= mean_limit, f"mean {steps.mean():.3f} steps"
    assert np.percentile(steps, 99.9) <= p999_limit + slack, f"99.9th percentile {np.percentile(steps, 99.9):.2f} steps"
    if device == "cpu":
        assert steps.max() <= 1.0 + slack, f"max {steps.max():.2f} steps"


@pytest.fixture(scope="module", params=DEVICES)
def device(request):
    return TorchDevice(request.param)


@pytest.fixture(scope="module")
def host():
    return HostDevice()


@pytest.fixture(scope="module")
def photos() -> dict[str, bytes]:
    found = {p.name: p.read_bytes() for p in sorted(SAMPLES.glob("*.jpg"))}
    found.update({f"imagenet-size-{i}": data
                  for i, data in enumerate(make_image_set(sorted(SAMPLES.glob("*.jpg")))[:4])})
    return found


def _row(device, data: bytes, spec: PreprocessSpec, policy: DecodePolicy = FULL):
    decoded = device.decode([[data]], policy, spec, False)
    assert not decoded.errors, decoded.errors
    return device.to_host(decoded.batch)[0]


@pytest.mark.parametrize("spec_name", sorted(SPECS))
def test_the_torch_path_matches_the_cpu_path(device, host, photos, spec_name):
    spec = SPECS[spec_name]
    names = sorted(photos)
    batch = device.decode([[photos[n]] for n in names], FULL, spec, False)  # one batched decode, mixed sizes
    expected = host.decode([[photos[n]] for n in names], FULL, spec, False)
    assert batch.batch.shape == expected.batch.shape and str(batch.batch.dtype).endswith(str(expected.batch.dtype))
    for i, name in enumerate(names):
        _assert_close(expected.batch[i], device.to_host(batch.batch)[i], spec, device.name.split(":")[0])


def test_imagenet_size_photos_get_no_draft_decode(host, photos):
    """The CPU path as it runs (draft on) equals its full decode for ImageNet-size photos."""
    for name, data in photos.items():
        if name.startswith("imagenet-size"):
            assert (np.array_equal(_row(host, data, PreprocessSpec(), DecodePolicy()),
                                   _row(host, data, PreprocessSpec())))


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied_as_pillow_does(device, host, halves_image, encode, orientation):
    exif = Image.Exif()
    exif[0x0112] = orientation
    image = halves_image(300, 200, (220, 30, 30), (30, 30, 220)).convert("RGB")
    pixels = np.array(image)
    pixels[:20, :] = (30, 200, 30)  # a green top band: a flip up-down shows too
    # Full-resolution chroma (4:4:4): the sharp red/blue edges would otherwise measure how
    # nvjpeg's chroma upsampling differs from libjpeg-turbo's (46 steps at the 99.9th
    # percentile on an H100), not the orientation.
    data = encode(Image.fromarray(pixels), "JPEG", quality=95, exif=exif.tobytes(), subsampling=0)
    assert gpu_jpeg(data, FULL).orientation == orientation
    spec = PreprocessSpec()
    _assert_close(_row(host, data, spec), _row(device, data, spec), spec, device.name.split(":")[0])


def _cmyk(encode) -> bytes:
    return encode(Image.new("CMYK", (120, 90), (10, 200, 30, 0)), "JPEG")


def _images(encode, smooth_image) -> dict[str, bytes]:
    jpeg = encode(smooth_image(320, 240), "JPEG", quality=90)
    return {
        "png": encode(smooth_image(320, 240), "PNG"),
        "cmyk_jpeg": _cmyk(encode),
        "base64_jpeg": base64.b64encode(jpeg),
        "truncated_jpeg": jpeg[: len(jpeg) // 2],
        "not_an_image": b"\xff\xd8\xff" + b"garbage" * 50 + b"\xff\xd9",
        "grey_jpeg": encode(smooth_image(320, 240).convert("L"), "JPEG", quality=90),
        "progressive_jpeg": encode(smooth_image(320, 240), "JPEG", quality=90, progressive=True),
        "jpeg": jpeg,
    }


def test_the_headers_say_which_images_the_gpu_takes(encode, smooth_image):
    taken = {name: gpu_jpeg(data, DecodePolicy()) is not None for name, data in _images(encode, smooth_image).items()}
    assert taken == {"png": False, "cmyk_jpeg": False, "base64_jpeg": False, "truncated_jpeg": False,
                     "not_an_image": False, "grey_jpeg": True, "progressive_jpeg": True, "jpeg": True}
    assert gpu_jpeg(_images(encode, smooth_image)["jpeg"], DecodePolicy(formats=("PNG",))) is None
    assert gpu_jpeg(_images(encode, smooth_image)["jpeg"], DecodePolicy(max_pixels=1000)) is None


def test_what_the_gpu_does_not_take_is_the_cpu_paths_own(device, host, encode, smooth_image):
    """Each image in its own request: same errors, word for word; the same pixels (the
    images decoded on the CPU are exactly the CPU path's, the rest within tolerance)."""
    images = _images(encode, smooth_image)
    names = sorted(images)
    spec = PreprocessSpec()
    got = device.decode([[images[n]] for n in names], FULL, spec, False)
    want = host.decode([[images[n]] for n in names], FULL, spec, False)
    assert {names[r]: str(e) for r, e in got.errors.items()} == {names[r]: str(e) for r, e in want.errors.items()}
    assert {r: e.reason for r, e in got.errors.items()} == {r: e.reason for r, e in want.errors.items()}
    assert set(names[r] for r in want.errors) == {"truncated_jpeg", "not_an_image"}
    assert np.array_equal(got.owners, want.owners)
    rows = device.to_host(got.batch)
    for i, r in enumerate(got.owners):
        if gpu_jpeg(images[names[r]], FULL) is None:
            assert np.array_equal(rows[i], want.batch[i]), names[r]
        else:
            _assert_close(want.batch[i], rows[i], spec, device.name.split(":")[0])


def test_a_bad_image_fails_its_request_and_names_its_index(device, host, encode, smooth_image):
    images = _images(encode, smooth_image)
    requests = [[images["jpeg"], images["png"]],
                [images["jpeg"], images["png"], images["truncated_jpeg"], images["not_an_image"]],
                None, [images["grey_jpeg"]]]
    got = device.decode(requests, FULL, PreprocessSpec(), True)
    want = host.decode(requests, FULL, PreprocessSpec(), True)
    assert got.bad_index == want.bad_index == {1: 2}
    assert str(got.errors[1]) == str(want.errors[1])
    assert list(got.owners) == list(want.owners) == [0, 0, 3]
    assert len(got.images) == 3 and all(tuple(img.shape[-2:]) == (240, 320) for img in got.images)


def test_a_batch_the_decoder_refuses_is_decoded_image_by_image(device, host, encode, smooth_image, monkeypatch):
    """The batched decode returns nothing when one image fails: the others are decoded on
    the device one by one, the refused one on the CPU; a refused kind (progressive) goes to
    the CPU from then on, without trying the device again."""
    images = _images(encode, smooth_image)
    real, calls = torch_preprocess.decode_jpegs, []

    def refusing(datas, where):
        calls.append(len(datas))
        if images["progressive_jpeg"] in datas:
            raise RuntimeError("nvjpeg: unsupported progressive stream (test)")
        return real(datas, where)

    monkeypatch.setattr(torch_preprocess, "decode_jpegs", refusing)
    fresh = TorchDevice(device.name)
    calls.clear()  # the decoder check at load
    batch = [[images["jpeg"]], [images["progressive_jpeg"]], [images["grey_jpeg"]]]
    spec = PreprocessSpec()
    got = fresh.decode(batch, FULL, spec, False)
    want = host.decode(batch, FULL, spec, False)
    assert not got.errors and calls == [3, 1, 1, 1]
    assert np.array_equal(fresh.to_host(got.batch)[1], want.batch[1])  # the CPU path's own row
    for row in (0, 2):
        _assert_close(want.batch[row], fresh.to_host(got.batch)[row], spec, device.name.split(":")[0])
    calls.clear()
    fresh.decode(batch, FULL, spec, False)
    assert calls == [2]  # progressive JPEGs now go straight to the CPU


def test_renormalize_and_flip_match_the_cpu_path(device, host, photos):
    have, want = SPECS["imagenet"], SPECS["effnet"]
    data = [[photos["mug.jpg"]]]
    on_device = device.decode(data, FULL, have, False).batch
    on_host = host.decode(data, FULL, have, False).batch
    _assert_close(host.renormalize(on_host, have, want), device.to_host(device.renormalize(on_device, have, want)),
                  want, device.name.split(":")[0])
    assert device.renormalize(on_device, have, SPECS["grey_thumbnail"]) is None
    flipped = device.to_host(device.flip(on_device, have.width_axis))
    assert np.array_equal(flipped, np.flip(device.to_host(on_device), axis=-1))


# Regions: the GPU path samples every region of an image in one torchvision roi_align call
# (bilinear, averaging ceil(scale) samples per output pixel), the CPU path resamples each
# with Pillow's antialiased bilinear filter (support as wide as the scale). Same geometry,
# different filters: measured here on the samples, torch on the CPU, the mean difference
# 0.07-0.83 step and 99.9% within 11 steps (a region shrunk 3x shows it most).
REGION_SPECS = {
    "stretch": PreprocessSpec(mode="stretch", crop=64),
    "text_line": PreprocessSpec(mode="keep_aspect", crop=48, width=320, mean=(0.5,) * 3, std=(0.5,) * 3,
                                pad_value=127.5),
    "centred_bgr_uint8": PreprocessSpec(mode="keep_aspect", crop=96, colour="BGR", layout="NHWC", dtype="UINT8",
                                        mean=(0.0,) * 3, std=(1.0,) * 3, scale=1.0, pad="centre"),
    "imagenet": PreprocessSpec(),
}
REGION_BOXES = np.array([[10, 20, 200, 120], [0, 0, 299, 299], [300.5, 100.25, 340.75, 118.5], [50, 50, 60, 290]])


@pytest.mark.parametrize("spec_name", sorted(REGION_SPECS))
@pytest.mark.parametrize("name", ["chelsea.jpg", "mug.jpg"])
def test_regions_are_cut_as_the_cpu_path_cuts_them(device, host, spec_name, name):
    spec = REGION_SPECS[spec_name]
    data = (SAMPLES / name).read_bytes()
    on_host = host.decode([[data]], FULL, spec, True)
    on_device = device.decode([[data]], FULL, spec, True)
    rows = np.zeros(len(REGION_BOXES), dtype=np.int64)
    cpu = host.crop(on_host.images, rows, REGION_BOXES, spec)
    other = device.to_host(device.crop(on_device.images, rows, REGION_BOXES, spec))
    assert other.shape == cpu.shape == (len(REGION_BOXES), *spec.input_shape)
    steps = _steps(cpu, other, spec)
    assert steps.mean() <= 1.0, f"mean {steps.mean():.3f} steps"
    assert np.percentile(steps, 99.9) <= 12, f"99.9th percentile {np.percentile(steps, 99.9):.2f} steps"
    if spec_name == "text_line":  # the square region fills 48 of 320 columns; the rest is padding, exactly 0
        assert (other[1, :, :, 48:] == 0).all() and (cpu[1, :, :, 48:] == 0).all()
