import functools
import io
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from xdist.scheduler import LoadFileScheduling

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


def once_per_run(tmp_path_factory, name: str, make) -> Path:
    """`make(folder)`'s result, made once per test run: with pytest-xdist's workers
    (./scripts/test.sh), the first to come makes it under a lock in their common temporary
    folder, and the others wait for it and use it."""
    from filelock import FileLock

    if "PYTEST_XDIST_WORKER" not in os.environ:
        return make(tmp_path_factory.mktemp(name))
    folder = tmp_path_factory.getbasetemp().parent / f"shared-{name}"
    done = folder / ".made"
    with FileLock(f"{folder}.lock"):
        if not done.is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            done.write_text(str(make(folder)))
    return Path(done.read_text())


@pytest.fixture(scope="session")
def onnx_model(tmp_path_factory) -> Path:
    """resnet50 with seeded random weights, exported as engine_build does it."""
    from engine_build.export_onnx import build_torch_model, export_onnx

    def make(folder: Path) -> Path:
        export_onnx(build_torch_model("random"), folder / "model.onnx", "random")
        return folder / "model.onnx"

    return once_per_run(tmp_path_factory, "onnx", make)


@pytest.fixture(scope="session")
def effnet_onnx_model(tmp_path_factory) -> Path:
    """efficientnet_lite0 with its shipped ImageNet weights, exported as engine_build does it."""
    from engine_build.export_onnx import build_torch_model, export_onnx

    def make(folder: Path) -> Path:
        export_onnx(build_torch_model("pretrained", "efficientnet_lite0"), folder / "model.onnx", "pretrained")
        return folder / "model.onnx"

    return once_per_run(tmp_path_factory, "effnet_onnx", make)


@pytest.fixture(scope="session")
def place_exports():
    """place(repo, {model: export}): copies each export's files (the graph, its weights, the
    weights stamp) into repo/model/1/, as the export would have written them there."""
    from engine_build.export_onnx import artifact_files

    def place(repo: Path, exports: dict[str, Path]) -> Path:
        for model, export in exports.items():
            version = repo / model / "1"
            version.mkdir(parents=True, exist_ok=True)
            for path in artifact_files(export):
                shutil.copy(path, version / path.name)
        return repo

    return place


# ---- how ./scripts/test.sh spreads the files over pytest-xdist's workers ---------------------
# The session `server` (tests/integration/conftest.py) serves about 30 models and takes 20 s
# of both cores to start: every file that uses it goes to one worker, which starts it once.
SESSION_SERVER_FILES = "session-server-files.txt"  # written by the workers, read by the controller
SESSION_SERVER_GROUP = "tests/integration (the files on the session server)"


def _uses_session_server(item) -> bool:
    return "server" in getattr(item, "fixturenames", ())


def _file(item) -> str:
    return item.nodeid.split("::")[0]


def pytest_collection_modifyitems(config, items):
    """With pytest-xdist's workers (./scripts/test.sh), the files on the session server go
    first (one work unit, see SessionServerScheduling), then the GPU tests and the other
    files that start servers, and the unit tests (many short files) last, to fill the
    workers' ends: a long file handed out last would run alone while the other worker idles.
    Files stay whole, in order. Without workers, unit tests first (testpaths): their
    failures show in seconds."""
    if not hasattr(config, "workerinput"):  # the controller hands out files in the workers' collection order
        return
    grouped = {_file(item) for item in items if _uses_session_server(item)}
    rank = {"gpu": 1, "integration": 2, "unit": 3}  # the GPU script's test is the longest file
    items.sort(key=lambda item: 0 if _file(item) in grouped else rank.get(Path(str(item.fspath)).parent.name, 2))
    # Every worker collects the same tests and writes the same list; the controller reads it
    # once all have sent their collections (in its basetemp: the workers' common parent).
    shared = config._tmp_path_factory.getbasetemp().parent / SESSION_SERVER_FILES
    written = shared.with_name(f"{shared.name}.{config.workerinput['workerid']}")
    written.write_text("\n".join(sorted(grouped)))
    os.replace(written, shared)


class SessionServerScheduling(LoadFileScheduling):
    """--dist loadfile, except that the files on the session server are one work unit."""

    def _split_scope(self, nodeid: str) -> str:
        file = super()._split_scope(nodeid)
        return SESSION_SERVER_GROUP if file in self._grouped else file

    @functools.cached_property
    def _grouped(self) -> frozenset[str]:  # first read in schedule(), once every worker has collected
        path = self.config._tmp_path_factory.getbasetemp() / SESSION_SERVER_FILES
        return frozenset(path.read_text().split()) if path.is_file() else frozenset()


def pytest_xdist_make_scheduler(config, log):
    return SessionServerScheduling(config, log) if config.getoption("dist") == "loadfile" else None


def pytest_addoption(parser):
    # 30 s: six 5 s samples. With four (20 s), a first-batch step followed by two thread
    # arenas' first allocations (+6 MB each, resnet50_onnx without its arena) read as a climb,
    # once in five full runs; a leak still grows in every interval of six.
    parser.addoption("--soak-seconds", type=float, default=30.0,
                     help="measured duration of the integration soak (CI default 30; the full soak: 120)")


@pytest.fixture(scope="session")
def soak_seconds(request) -> float:
    return request.config.getoption("--soak-seconds")


# ---- image builders for the unit and GPU tests, handed out as fixtures -----------------------
# (fixtures rather than `from conftest import ...`: a conftest outside a package is not a
# reliably importable module once a test folder has one of its own)
def _encode(img: Image.Image, fmt: str, **save_kwargs) -> bytes:
    """`img` encoded as `fmt` (a Pillow format name), as a client would send it."""
    buf = io.BytesIO()
    img.save(buf, fmt, **save_kwargs)
    return buf.getvalue()


def _noise_image(width: int, height: int, seed: int = 0) -> Image.Image:
    """Uniform RGB noise: every resampling or crop-offset mistake shows up in it."""
    pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels, "RGB")


def _smooth_image(width: int, height: int) -> Image.Image:
    """Low-frequency RGB gradients, closer to a photo than noise is."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    u, v = x / max(width - 1, 1), y / max(height - 1, 1)
    rgb = np.stack([u, v, 0.5 + 0.5 * np.sin(6.0 * u + 4.0 * v)], axis=-1)
    return Image.fromarray((rgb * 255.0 + 0.5).astype(np.uint8), "RGB")


def _halves_image(width: int, height: int, left: tuple[int, int, int], right: tuple[int, int, int]) -> Image.Image:
    """Left half one colour, right half another: shows rotations and flips."""
    pixels = np.empty((height, width, 3), dtype=np.uint8)
    pixels[:, : width // 2] = left
    pixels[:, width // 2:] = right
    return Image.fromarray(pixels, "RGB")


@pytest.fixture(scope="session")
def encode():
    return _encode


@pytest.fixture(scope="session")
def noise_image():
    return _noise_image


@pytest.fixture(scope="session")
def smooth_image():
    return _smooth_image


@pytest.fixture(scope="session")
def halves_image():
    return _halves_image
