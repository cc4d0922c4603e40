"""The OCR models' weights -> models/text_detector, text_orientation and text_recognizer.

    python -m engine_build ocr [--repository models]

The weights are PaddleOCR's PP-OCR ONNX exports as shipped in the rapidocr-onnxruntime
wheel (Apache-2.0), pinned by version and sha256. Only its files are used: the wheel is
downloaded with pip (--no-deps: nothing of rapidocr is installed), kept in build/ so a
second run does not download it again, and each ONNX file is written with clean tensor
names (the ones the models' config.pbtxt declare). The recogniser's character list, kept
in the ONNX metadata, is written beside it as characters.txt.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

__all__ = ["OCR_MODELS", "OcrWeightsUnavailable", "WHEEL", "build_ocr_models", "fetch_wheel"]

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"
CACHE = ROOT / "build" / "ocr"
PYPI_INDEX = "https://pypi.org/simple"


@dataclass(frozen=True)
class Wheel:
    package: str
    version: str
    sha256: str

    @property
    def filename(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"


WHEEL = Wheel("rapidocr-onnxruntime", "1.4.4", "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf")


@dataclass(frozen=True)
class OcrModel:
    folder: str  # model folder in the repository; the ONNX goes to <folder>/1/model.onnx
    member: str  # path of the ONNX file inside the wheel
    names: dict[str, str]  # the wheel's tensor names -> ours (config.pbtxt)
    characters: bool = False  # its metadata's character list goes to <folder>/1/characters.txt
    # Also an OpenVINO IR of it (<folder>/1/model.xml + .bin, FP32): the detector's, which
    # OpenVINO runs faster here with the same boxes (docs/performance.md), detect.py opening it.
    openvino: bool = False


OCR_MODELS = (
    OcrModel("text_detector", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
             {"x": "image", "sigmoid_0.tmp_0": "prob_map"}, openvino=True),
    OcrModel("text_orientation", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
             {"x": "image", "save_infer_model/scale_0.tmp_1": "probs"}),
    OcrModel("text_recognizer", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
             {"x": "image", "softmax_11.tmp_0": "probs"}, characters=True),
)
# The recogniser's metadata key holding its characters, one per line; written beside its model.
CHARACTERS_KEY = "character"
CHARACTERS_FILE = "characters.txt"


class OcrWeightsUnavailable(RuntimeError):
    """The pinned wheel could not be downloaded, or is not the file we pinned."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_wheel(cache: Path = CACHE, wheel: Wheel = WHEEL) -> Path:
    """The pinned wheel in `cache`, downloaded with pip unless a copy with the right hash is there."""
    cache = Path(cache)
    path = cache / wheel.filename
    if path.is_file():
        if _sha256(path) == wheel.sha256:
            log.info("using %s (cached, sha256 checked)", path)
            return path
        log.warning("%s does not have the pinned sha256: downloading it again", path)
        path.unlink()
    cache.mkdir(parents=True, exist_ok=True)
    spec = f"{wheel.package}=={wheel.version}"
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        # --ignore-requires-python: the wheel's Python bound is rapidocr's code's, not its ONNX files'.
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--ignore-requires-python", "--disable-pip-version-check", spec, "-d", tmp]
        log.info("downloading %s: %s", spec, " ".join(command))
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        got = Path(tmp) / wheel.filename
        if done.returncode != 0 or not got.is_file():
            tail = "\n".join(done.stdout.strip().splitlines()[-5:])
            raise OcrWeightsUnavailable(
                f"could not download {spec} (the OCR weights) from the Python package index ({PYPI_INDEX}, or the "
                f"index your pip is configured for): pip exited with {done.returncode}:\n{tail}\n"
                f"Without network access, put {wheel.filename} (sha256 {wheel.sha256}) in {cache}/ and run this again.")
        digest = _sha256(got)
        if digest != wheel.sha256:
            raise OcrWeightsUnavailable(f"{spec} from the package index has sha256 {digest}, not the pinned "
                                        f"{wheel.sha256}: refusing to use it")
        os.replace(got, path)
    return path


def _rename(graph, names: dict[str, str]) -> None:
    """Graph inputs/outputs renamed, with every node (and subgraph) that reads or writes them."""
    graph_names = {v.name for v in (*graph.input, *graph.output)}
    missing = sorted(set(names) - graph_names)
    if missing:
        raise ValueError(f"the ONNX graph has no input/output {', '.join(missing)} (it has "
                         f"{', '.join(sorted(graph_names))})")

    def visit(g):
        for value in (*g.input, *g.output, *g.value_info):
            value.name = names.get(value.name, value.name)
        for node in g.node:
            node.input[:] = [names.get(n, n) for n in node.input]
            node.output[:] = [names.get(n, n) for n in node.output]
            for attr in node.attribute:
                for sub in (*([attr.g] if attr.HasField("g") else []), *attr.graphs):
                    visit(sub)

    visit(graph)


def _write_model(data: bytes, model: OcrModel, version_dir: Path) -> dict[str, str]:
    """The renamed ONNX written to version_dir/model.onnx; returns its metadata."""
    try:
        import onnx
    except ImportError as exc:
        raise ImportError("the OCR build needs the onnx package: pip install 'bls-pipeline[build]'") from exc
    proto = onnx.load_from_string(data)
    _rename(proto.graph, model.names)
    onnx.checker.check_model(proto)
    version_dir.mkdir(parents=True, exist_ok=True)
    target = version_dir / "model.onnx"
    partial = target.with_name(target.name + ".tmp")  # never a half-written model.onnx: the launcher loads what exists
    onnx.save(proto, str(partial))
    os.replace(partial, target)
    return {p.key: p.value for p in proto.metadata_props}


def _write_openvino(onnx_path: Path) -> Path | None:
    """An FP32 OpenVINO IR of onnx_path beside it (model.xml, model.bin), or None, saying why,
    where openvino is not installed (the model then runs its ONNX by onnxruntime)."""
    try:
        import openvino as ov
    except ImportError:
        log.warning("openvino is not installed: %s runs by onnxruntime (pip install 'bls-pipeline[openvino]' "
                    "for its faster OpenVINO IR)", onnx_path.parent.parent.name)
        return None
    target = onnx_path.with_suffix(".xml")
    partial = target.with_name("partial.xml")  # its .bin beside it: renamed together once both are written
    ov.save_model(ov.convert_model(str(onnx_path)), str(partial), compress_to_fp16=False)
    os.replace(partial.with_suffix(".bin"), target.with_suffix(".bin"))
    os.replace(partial, target)
    return target


def build_ocr_models(repository: Path = MODELS, cache: Path = CACHE) -> dict[str, Path]:
    """Writes the three OCR models' ONNX files (and the recogniser's characters) into
    `repository`; returns {model folder: ONNX path}."""
    repository = Path(repository)
    written = {}
    with tqdm(total=1 + len(OCR_MODELS), desc="ocr models", unit="step", file=sys.stderr) as steps:
        steps.set_postfix_str(f"fetch {WHEEL.package}=={WHEEL.version}")
        wheel = fetch_wheel(cache)
        steps.update()
        with zipfile.ZipFile(wheel) as archive:
            for model in OCR_MODELS:
                steps.set_postfix_str(model.folder)
                version_dir = repository / model.folder / "1"
                metadata = _write_model(archive.read(model.member), model, version_dir)
                if model.characters:
                    if CHARACTERS_KEY not in metadata:
                        raise ValueError(f"{model.member} has no {CHARACTERS_KEY!r} metadata: cannot write its "
                                         "characters")
                    (version_dir / CHARACTERS_FILE).write_text(metadata[CHARACTERS_KEY].rstrip("\n") + "\n",
                                                               encoding="utf-8")
                written[model.folder] = version_dir / "model.onnx"
                if model.openvino:
                    _write_openvino(written[model.folder])
                log.info("wrote %s (%s, inputs/outputs %s)", written[model.folder], Path(model.member).name,
                         ", ".join(f"{a} -> {b}" for a, b in model.names.items()))
                steps.update()
    return written
