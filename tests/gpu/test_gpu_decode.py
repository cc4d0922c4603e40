"""The GPU path's decoding on CUDA (nvjpeg through torchvision) against the CPU path:
tests/unit/test_gpu_pixels.py runs its parity tests on CUDA too; these add what only a GPU
shows: nvjpeg's own pixels, a full-size photo, the fallback of what nvjpeg refuses."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from bls_pipeline.runtime.decode.device import HostDevice
from bls_pipeline.stages.decode import DecodePolicy, decode
from bls_pipeline.stages.preprocess import PreprocessSpec

pytestmark = pytest.mark.gpu
REQUIRES = ("cuda",)
FULL = DecodePolicy(draft_min_side=0)


@pytest.fixture(scope="module")
def device():
    from bls_pipeline.runtime.decode.torch_device import TorchDevice

    return TorchDevice("cuda:0")


def _steps(a, b, spec=PreprocessSpec()):
    return (np.abs(a.astype(np.float32) - b.astype(np.float32)) * np.asarray(spec.std, np.float32).reshape(-1, 1, 1)
            / spec.scale)


def test_nvjpeg_decodes_as_libjpeg_does_within_torchvisions_own_bound(sample_images):
    """torchvision's own test: nvjpeg's pixels differ from libjpeg's by under 2 steps on average."""
    from bls_pipeline.stages.torch_preprocess import decode_jpegs

    for name, data in sample_images.items():
        (on_gpu,) = decode_jpegs([data], "cuda:0")
        reference = np.asarray(decode(data, FULL)).transpose(2, 0, 1)
        diff = np.abs(on_gpu.cpu().numpy().astype(np.float32) - reference)
        print(f"{name}: nvjpeg vs Pillow, mean {diff.mean():.3f} steps, max {diff.max():.0f}")
        assert diff.mean() < 2, name


def test_a_full_size_photo_matches_the_cpu_paths_full_decode(device, shared_mug):
    spec = PreprocessSpec()
    got = device.to_host(device.decode([[shared_mug]], FULL, spec, False).batch)
    want = HostDevice().decode([[shared_mug]], FULL, spec, False).batch
    steps = _steps(want, got)
    print(f"12 MP mug: mean {steps.mean():.3f} steps, 99.9th percentile {np.percentile(steps, 99.9):.2f}, max "
          f"{steps.max():.1f}")
    assert steps.mean() <= 1.0 and np.percentile(steps, 99.9) <= 8.0


def test_cmyk_and_png_fall_back_and_a_batch_mixes_both_paths(device, encode, smooth_image, sample_images):
    cmyk = encode(Image.new("CMYK", (200, 150), (0, 120, 200, 10)), "JPEG")
    png = encode(smooth_image(200, 150), "PNG")
    corrupt = b"\xff\xd8\xff\xe0" + b"\x00" * 64 + b"\xff\xd9"
    requests = [[cmyk], [sample_images["mug"]], [png], [corrupt], [sample_images["coffee"]]]
    got = device.decode(requests, FULL, PreprocessSpec(), False)
    want = HostDevice().decode(requests, FULL, PreprocessSpec(), False)
    assert {r: str(e) for r, e in got.errors.items()} == {r: str(e) for r, e in want.errors.items()} and 3 in got.errors
    rows = device.to_host(got.batch)
    assert np.array_equal(rows[0], want.batch[0]) and np.array_equal(rows[2], want.batch[2])  # decoded on the CPU
    for i in (1, 3):
        assert _steps(want.batch[i], rows[i]).mean() <= 1.0
