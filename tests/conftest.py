from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_mug() -> bytes:
    """The full-size Triton sample photo from ../shared (3361x2521), when present."""
    path = SHARED / "images" / "mug.jpg"
    if not path.exists():
        pytest.skip(f"{path} is not present (../shared is optional)")
    return path.read_bytes()


@pytest.fixture(scope="session")
def sample_images() -> dict[str, bytes]:
    """The photos shipped in samples/ (always present)."""
    return {p.stem: p.read_bytes() for p in sorted((REPO / "samples").glob("*.jpg"))}


@pytest.fixture(scope="session")
def onnx_model(tmp_path_factory) -> Path:
    """resnet50 with seeded random weights, exported as engine_build does it."""
    from engine_build.export_onnx import build_torch_model, export_onnx

    path = tmp_path_factory.mktemp("onnx") / "model.onnx"
    export_onnx(build_torch_model("random"), path, "random")
    return path


@pytest.fixture(scope="session")
def effnet_onnx_model(tmp_path_factory) -> Path:
    """efficientnet_lite0 with its shipped ImageNet weights, exported as engine_build does it."""
    from engine_build.export_onnx import build_torch_model, export_onnx

    path = tmp_path_factory.mktemp("effnet_onnx") / "model.onnx"
    export_onnx(build_torch_model("pretrained", "efficientnet_lite0"), path, "pretrained")
    return path


def pytest_addoption(parser):
    parser.addoption("--soak-seconds", type=float, default=20.0,
                     help="measured duration of the integration soak (CI default 20; the full soak: 120)")


@pytest.fixture(scope="session")
def soak_seconds(request) -> float:
    return request.config.getoption("--soak-seconds")
