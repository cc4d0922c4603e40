"""What a flow needs to know to call one child model, read from that model's own folder.

Everything comes from the child's config.pbtxt and files beside it, nothing from the
flow or from ImageNet:
- its input: name, data type and dims. A TYPE_STRING input takes the encoded image bytes
  as sent; a pixel input (FP32, FP16, UINT8) gets them decoded and preprocessed the way its
  `preprocess_*` parameters say (table below), the size taken from its dims;
- its outputs: names, data types and dims;
- for a classifier, its label file: Triton's own `label_filename` on its one output (one
  label per line, in the model's folder); the number of classes is that output's dim and
  must match the file.

    parameter                 default            meaning
    preprocess_resize_mode    shorter_side       or stretch (whole image to the input size)
    preprocess_resize         input size / 0.875 shorter side before the centre crop
    preprocess_colour         from the channels  RGB, BGR or GRAY (1 channel)
    preprocess_layout         from the dims      NCHW or NHWC
    preprocess_scale          1/255              pixel * scale, before mean/std
    preprocess_mean/std       ImageNet's (RGB)   per channel, comma-separated (0, 1 for GRAY)
    preprocess_crop           input size         must agree with the dims when given
    output_scores             logits             or probabilities (no softmax)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..stages.preprocess import COLOURS, IMAGENET_MEAN, IMAGENET_STD, LAYOUTS, RESIZE_MODES, PreprocessSpec
from .modelconfig import data_type, parse_config, string_parameters
from .settings import ConfigError, _as_float, _as_int

__all__ = ["CHILDREN_DIR", "ChildModel", "TensorInfo", "child_model", "load_child", "version_folders"]

# In a flow model's folder: copies of the config and labels of the models it calls, for a
# repository whose model folders Triton copies one by one (S3). bls-publish writes them.
CHILDREN_DIR = "children"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # Triton data type without TYPE_ ("FP32", "STRING", ...)
    dims: tuple[int, ...]  # without the batch dimension


@dataclass(frozen=True)
class ChildModel:
    name: str
    max_batch_size: int
    input: TensorInfo
    outputs: tuple[TensorInfo, ...]
    preprocess: PreprocessSpec | None  # None: the input takes the encoded image bytes
    labels: tuple[str, ...] | None = None  # classifiers only
    scores: str = "logits"  # what a classifier's output holds: "logits" or "probabilities"

    @property
    def is_classifier(self) -> bool:
        return self.labels is not None

    @property
    def scores_output(self) -> TensorInfo:
        """The output a classify() call reads: a classifier's one output."""
        return self.outputs[0]


_PREPROCESS_KEYS = ("preprocess_resize_mode", "preprocess_resize", "preprocess_colour", "preprocess_layout",
                    "preprocess_scale", "preprocess_mean", "preprocess_std", "preprocess_crop")
_PIXEL_TYPES = ("FP32", "FP16", "UINT8")


def _values(model: str, key: str, raw: str, count: int) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in raw.split(","))
    except ValueError:
        values = ()
    if len(values) != count:
        example = "0.485,0.456,0.406" if count == 3 else "0.5"
        raise ConfigError(f"model {model}: parameter {key}={raw!r}: write {'three comma-separated numbers' if count == 3 else 'one number'} "
                          f"(per channel, in scaled units), e.g. \"{example}\"")
    return values


def _layout(model: str, dims: tuple[int, ...], params: dict[str, str]) -> str:
    if "preprocess_layout" in params:
        layout = params["preprocess_layout"].strip().upper()
        if layout not in LAYOUTS:
            raise ConfigError(f"model {model}: parameter preprocess_layout={layout!r}: write one of {', '.join(LAYOUTS)}")
        return layout
    if dims[-1] in (1, 3) and dims[0] not in (1, 3):
        return "NHWC"
    return "NCHW"


def _preprocess(model: str, tensor: TensorInfo, params: dict[str, str]) -> PreprocessSpec:
    dims = tensor.dims
    if len(dims) != 3:
        raise ConfigError(f"model {model}: input {tensor.name} has dims {list(dims)}; an image input needs 3 "
                          "([C,H,W] or [H,W,C]), or TYPE_STRING for the encoded bytes")
    layout = _layout(model, dims, params)
    channels, height, width = (dims[0], dims[1], dims[2]) if layout == "NCHW" else (dims[2], dims[0], dims[1])
    if height != width or height < 1:
        raise ConfigError(f"model {model}: input {tensor.name} is {height}x{width}; images are fed square: make its dims square")
    colour = params.get("preprocess_colour", "RGB" if channels == 3 else "GRAY").strip().upper()
    if COLOURS.get(colour) != channels:
        raise ConfigError(f"model {model}: parameter preprocess_colour={colour!r} does not fit input {tensor.name}'s "
                          f"{channels} channel(s) ({layout} dims {list(dims)}): write one of "
                          f"{', '.join(c for c, n in COLOURS.items() if n == channels) or 'nothing: use 1 or 3 channels'}")
    crop = height
    if "preprocess_crop" in params and _as_int("preprocess_crop", params["preprocess_crop"], 1) != crop:
        raise ConfigError(f"model {model}: parameter preprocess_crop={params['preprocess_crop']} but input {tensor.name} "
                          f"is {crop}x{crop} ({layout} dims {list(dims)}): make them agree")
    mode = params.get("preprocess_resize_mode", "shorter_side").strip().lower()
    if mode not in RESIZE_MODES:
        raise ConfigError(f"model {model}: parameter preprocess_resize_mode={mode!r}: write one of {', '.join(RESIZE_MODES)}")
    resize = _as_int("preprocess_resize", params["preprocess_resize"], 1) if "preprocess_resize" in params else round(crop / 0.875)
    if tensor.dtype == "UINT8":
        given = [k for k in ("preprocess_mean", "preprocess_std", "preprocess_scale") if k in params]
        if given:
            raise ConfigError(f"model {model}: input {tensor.name} takes UINT8 pixels as they are; remove {', '.join(given)}")
        mean, std, scale = (0.0,) * channels, (1.0,) * channels, 1.0
    else:
        default_mean, default_std = (IMAGENET_MEAN, IMAGENET_STD) if channels == 3 else ((0.0,), (1.0,))
        mean = _values(model, "preprocess_mean", params["preprocess_mean"], channels) if "preprocess_mean" in params else default_mean
        std = _values(model, "preprocess_std", params["preprocess_std"], channels) if "preprocess_std" in params else default_std
        scale = _as_float("preprocess_scale", params["preprocess_scale"], 0.0) if "preprocess_scale" in params else 1.0 / 255.0
    try:
        return PreprocessSpec(resize=resize, crop=crop, mean=mean, std=std, mode=mode, colour=colour, layout=layout,
                              dtype=tensor.dtype, scale=scale)
    except ValueError as exc:
        raise ConfigError(f"model {model}: {exc}; fix its preprocess_* parameters") from None


def _labels(model: str, model_dir: Path | None, output_config, output: TensorInfo) -> tuple[str, ...] | None:
    if not output_config.label_filename:
        return None
    path = (model_dir or Path(".")) / output_config.label_filename
    if not path.is_file():
        raise ConfigError(f"model {model}: output {output.name} has label_filename {output_config.label_filename!r}, "
                          f"which is not in the model's folder")
    labels = tuple(line for line in path.read_text(encoding="utf-8").splitlines() if line)
    if len(output.dims) != 1 or output.dims[0] != len(labels):
        raise ConfigError(f"model {model}: {path.name} has {len(labels)} labels but output {output.name} has dims "
                          f"{list(output.dims)}; a classifier's output must be [{len(labels)}]")
    return labels


def child_model(name: str, config, model_dir: Path | None = None) -> ChildModel:
    """A ChildModel from a parsed config (and its folder, for the label file)."""
    try:
        return _child_model(name, config, model_dir)
    except ConfigError as exc:
        if str(exc).startswith(f"model {name}"):
            raise
        raise ConfigError(f"model {name}: {exc}") from None


def _child_model(name: str, config, model_dir: Path | None) -> ChildModel:
    if config.max_batch_size < 1:
        raise ConfigError(f"model {name} needs max_batch_size >= 1 in its config.pbtxt (got {config.max_batch_size}): "
                          "a flow sends it every image of an execute() as one batch")
    required = [t for t in config.input if not t.optional]
    if len(required) != 1:
        raise ConfigError(f"model {name} has {len(required)} required inputs ({', '.join(t.name for t in required)}); "
                          "a flow calls models with one image input")
    if not config.output:
        raise ConfigError(f"model {name} declares no output in its config.pbtxt")
    tensor = TensorInfo(required[0].name, data_type(required[0]), tuple(required[0].dims))
    outputs = tuple(TensorInfo(t.name, data_type(t), tuple(t.dims)) for t in config.output)
    params = string_parameters(config)
    if tensor.dtype == "STRING":
        preprocess = None
    elif tensor.dtype in _PIXEL_TYPES:
        preprocess = _preprocess(name, tensor, params)
    else:
        raise ConfigError(f"model {name}: input {tensor.name} is TYPE_{tensor.dtype}; a flow feeds TYPE_STRING "
                          f"(encoded bytes) or pixels as {', '.join('TYPE_' + t for t in _PIXEL_TYPES)}")
    scores = params.get("output_scores", "logits").strip().lower()
    if scores not in ("logits", "probabilities"):
        raise ConfigError(f"model {name}: parameter output_scores={scores!r}: write logits or probabilities")
    labels = _labels(name, model_dir, config.output[0], outputs[0])
    if labels is not None and len(outputs) != 1:
        raise ConfigError(f"model {name} has a label_filename and {len(outputs)} outputs; a classifier has one output, its scores")
    return ChildModel(name, config.max_batch_size, tensor, outputs, preprocess, labels, scores)


def load_child(repo: Path, name: str, caller_dir: Path | None = None) -> ChildModel:
    """The ChildModel of `name`, a sibling folder in the model repository `repo`; where there
    is none, the copy of its config and labels in the caller's CHILDREN_DIR (`caller_dir`).

    Triton copies a model's own folder, alone, from a remote repository (S3) to local disk:
    there the siblings are absent, and bls-publish puts the copies in each flow model's folder."""
    model_dir = Path(repo) / name
    if not (model_dir / "config.pbtxt").is_file() and caller_dir is not None:
        copy = Path(caller_dir) / CHILDREN_DIR / name
        if (copy / "config.pbtxt").is_file():
            model_dir = copy
        else:
            raise ConfigError(f"model {name} has no {model_dir / 'config.pbtxt'} and {Path(caller_dir).name} has no copy in "
                              f"{copy}: fix the setting that names it, or add the model. From a remote repository (S3) "
                              f"Triton copies only {Path(caller_dir).name}'s own folder: publish it with bls-publish, "
                              f"which copies the config and labels of every model it calls into {CHILDREN_DIR}/")
    if not (model_dir / "config.pbtxt").is_file():
        raise ConfigError(f"model {name} has no {model_dir / 'config.pbtxt'}: fix the setting that names it, or add the model")
    return child_model(name, parse_config(model_dir), model_dir)


def version_folders(model_dir: Path) -> tuple[str, ...]:
    """The model's version folders (numbered sub-folders), newest first."""
    try:
        names = [p.name for p in Path(model_dir).iterdir() if p.is_dir() and p.name.isdigit()]
    except OSError:
        return ()
    return tuple(sorted(names, key=int, reverse=True))
