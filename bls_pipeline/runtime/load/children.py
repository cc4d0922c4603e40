"""What a flow needs to know to call one child model, read from that model's own folder.

Everything comes from the child's config.pbtxt and files beside it, nothing from the
flow or from ImageNet:
- its inputs: names, data types and dims. The image input (if it has one) is what the
  runtime feeds from the request's images: a TYPE_STRING input takes the encoded bytes as
  sent; a pixel input (FP32, FP16, UINT8, dims [C,H,W] or [H,W,C]) gets them decoded and
  preprocessed the way its `preprocess_*` parameters say (table below), the size from its
  dims. It is the child's one required input when that is a string or has image dims, or
  the one `image_input` names. Every other input is a tensor the flow passes by name
  (`inputs={"features": ...}`): another child's outputs, or values it computed;
- its outputs: names, data types and dims;
- for a classifier, its label file: Triton's own `label_filename` on its one output (one
  label per line, in the model's folder); the number of classes is that output's dim and
  must match the file;
- for a detector, which outputs hold its boxes (`Detector`, the `boxes_*` keys below).

    parameter                 default            meaning
    preprocess_resize_mode    shorter_side       stretch (whole image to the input size) or
                                                 keep_aspect (fit, aspect kept, padded)
    preprocess_resize         input size / 0.875 shorter side before the centre crop
    preprocess_pad            bottom_right       keep_aspect: or centre
    preprocess_pad_value      0                  keep_aspect: the padding, in pixel units (0-255)
    preprocess_colour         from the channels  RGB, BGR or GRAY (1 channel)
    preprocess_layout         from the dims      NCHW or NHWC
    preprocess_scale          1/255              pixel * scale, before mean/std
    preprocess_mean/std       ImageNet's (RGB)   per channel, comma-separated (0, 1 for GRAY)
    preprocess_crop           input size         must agree with the dims when given
    output_scores             logits             or probabilities (no softmax)
    image_input               the one required   which input takes the image, when there are several
    boxes_output              (not a detector)   the output holding each image's boxes, dims [-1, 4]
    boxes_units               (required)         pixels or normalized (0..1), of the input it saw
    boxes_format              xyxy               or xywh, cxcywh
    box_scores_output         none               [-1]: each box's score
    box_classes_output        none               [-1]: each box's class id
    count_output              none               [1]: how many boxes are real (the rest padding);
                                                 without it, all-zero boxes are padding
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...stages.preprocess import COLOURS, IMAGENET_MEAN, IMAGENET_STD, LAYOUTS, PAD_PLACES, RESIZE_MODES, PreprocessSpec
from ...base.dtypes import PIXEL_TYPES
from ...base.tensors import TensorInfo
from ...base.modelconfig import data_type, parse_config, string_parameters
from ...base.errors import ConfigError
from ...engines.artifact_io import exported_weights
from .fields import as_float, as_int

__all__ = ["CHILDREN_DIR", "ChildModel", "Detector", "child_folder", "child_model",
           "load_child", "version_folders"]

# In a flow model's folder: copies of the config and labels of the models it calls, for a
# repository whose model folders Triton copies one by one (S3). bls-publish writes them.
CHILDREN_DIR = "children"


BOX_FORMATS = ("xyxy", "xywh", "cxcywh")
BOX_UNITS = ("pixels", "normalized")


@dataclass(frozen=True)
class Detector:
    """Which of a detector's outputs hold its boxes, and how (its config's boxes_* keys)."""

    boxes: str
    units: str  # "pixels" or "normalized", of the input it saw (its pixels, or the image as sent)
    format: str = "xyxy"
    scores: str | None = None
    classes: str | None = None
    count: str | None = None


@dataclass(frozen=True)
class ChildModel:
    name: str
    max_batch_size: int
    image: TensorInfo | None  # the input the runtime feeds from the images; None: tensors only
    outputs: tuple[TensorInfo, ...]
    preprocess: PreprocessSpec | None  # None: no pixel input (encoded bytes, or tensors only)
    labels: tuple[str, ...] | None = None  # classifiers only
    scores: str = "logits"  # what a classifier's output holds: "logits" or "probabilities"
    inputs: tuple[TensorInfo, ...] = ()  # every input it declares, the image input included
    detector: Detector | None = None
    # Said in the log and in each answer it gives: its engine was exported with random
    # weights, so its labels mean nothing (None: real weights, or not known to be random).
    warning: str | None = None

    @property
    def input(self) -> TensorInfo | None:
        return self.image

    @property
    def is_classifier(self) -> bool:
        return self.labels is not None

    def input_named(self, name: str) -> TensorInfo | None:
        return next((t for t in self.inputs if t.name == name), None)

    @property
    def scores_output(self) -> TensorInfo:
        """The output a classify() call reads: a classifier's one output."""
        return self.outputs[0]


_PREPROCESS_KEYS = ("preprocess_resize_mode", "preprocess_resize", "preprocess_colour", "preprocess_layout",
                    "preprocess_scale", "preprocess_mean", "preprocess_std", "preprocess_crop", "preprocess_pad",
                    "preprocess_pad_value")


def _values(model: str, key: str, raw: str, count: int) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in raw.split(","))
    except ValueError:
        values = ()
    if len(values) != count:
        example = "0.485,0.456,0.406" if count == 3 else "0.5"
        raise ConfigError(f"model {model}: parameter {key}={raw!r}: write "
                          f"{'three comma-separated numbers' if count == 3 else 'one number'} (per channel, in scaled "
                          f"units), e.g. \"{example}\"")
    return values


def _layout(model: str, dims: tuple[int, ...], params: dict[str, str]) -> str:
    if "preprocess_layout" in params:
        layout = params["preprocess_layout"].strip().upper()
        if layout not in LAYOUTS:
            raise ConfigError(f"model {model}: parameter preprocess_layout={layout!r}: write one of "
                              f"{', '.join(LAYOUTS)}")
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
    mode = params.get("preprocess_resize_mode", "shorter_side").strip().lower()
    if mode not in RESIZE_MODES:
        raise ConfigError(f"model {model}: parameter preprocess_resize_mode={mode!r}: write one of "
                          f"{', '.join(RESIZE_MODES)}")
    if height < 1 or width < 1:
        raise ConfigError(f"model {model}: input {tensor.name} is {height}x{width}; give it a fixed image size")
    if height != width and mode == "shorter_side":
        raise ConfigError(f"model {model}: input {tensor.name} is {height}x{width}, and resize mode shorter_side "
                          "centre-crops a square: make its dims square, or set preprocess_resize_mode to stretch or "
                          "keep_aspect")
    colour = params.get("preprocess_colour", "RGB" if channels == 3 else "GRAY").strip().upper()
    if COLOURS.get(colour) != channels:
        fitting = ", ".join(c for c, n in COLOURS.items() if n == channels) or "nothing: use 1 or 3 channels"
        raise ConfigError(f"model {model}: parameter preprocess_colour={colour!r} does not fit input {tensor.name}'s "
                          f"{channels} channel(s) ({layout} dims {list(dims)}): write one of {fitting}")
    crop = height
    if "preprocess_crop" in params and as_int("preprocess_crop", params["preprocess_crop"], 1) != crop:
        raise ConfigError(f"model {model}: parameter preprocess_crop={params['preprocess_crop']} but input "
                          f"{tensor.name} is {height}x{width} ({layout} dims {list(dims)}): make them agree")
    resize = (as_int("preprocess_resize", params["preprocess_resize"], 1) if "preprocess_resize" in params
              else round(crop / 0.875))
    if tensor.dtype == "UINT8":
        given = [k for k in ("preprocess_mean", "preprocess_std", "preprocess_scale") if k in params]
        if given:
            raise ConfigError(f"model {model}: input {tensor.name} takes UINT8 pixels as they are; remove "
                              f"{', '.join(given)}")
        mean, std, scale = (0.0,) * channels, (1.0,) * channels, 1.0
    else:
        default_mean, default_std = (IMAGENET_MEAN, IMAGENET_STD) if channels == 3 else ((0.0,), (1.0,))
        mean = (_values(model, "preprocess_mean", params["preprocess_mean"], channels) if "preprocess_mean" in params
                else default_mean)
        std = (_values(model, "preprocess_std", params["preprocess_std"], channels) if "preprocess_std" in params
               else default_std)
        scale = (as_float("preprocess_scale", params["preprocess_scale"], 0.0) if "preprocess_scale" in params
                 else 1.0 / 255.0)
    pad = params.get("preprocess_pad", "bottom_right").strip().lower()
    if pad not in PAD_PLACES:
        raise ConfigError(f"model {model}: parameter preprocess_pad={pad!r}: write one of {', '.join(PAD_PLACES)}")
    pad_value = (as_float("preprocess_pad_value", params["preprocess_pad_value"], 0.0, 255.0)
                 if "preprocess_pad_value" in params else 0.0)
    try:
        return PreprocessSpec(resize=resize, crop=crop, mean=mean, std=std, mode=mode, colour=colour, layout=layout,
                              dtype=tensor.dtype, scale=scale, width=0 if width == height else width, pad=pad,
                              pad_value=pad_value)
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
    if not config.input:
        raise ConfigError(f"model {name} declares no input in its config.pbtxt")
    if not config.output:
        raise ConfigError(f"model {name} declares no output in its config.pbtxt")
    inputs = tuple(TensorInfo(t.name, data_type(t), tuple(t.dims), bool(t.optional)) for t in config.input)
    outputs = tuple(TensorInfo(t.name, data_type(t), tuple(t.dims)) for t in config.output)
    params = string_parameters(config)
    image = _image_input(name, inputs, params)
    preprocess = _preprocess(name, image, params) if image is not None and image.dtype != "STRING" else None
    scores = params.get("output_scores", "logits").strip().lower()
    if scores not in ("logits", "probabilities"):
        raise ConfigError(f"model {name}: parameter output_scores={scores!r}: write logits or probabilities")
    labels = _labels(name, model_dir, config.output[0], outputs[0])
    if labels is not None and len(outputs) != 1:
        raise ConfigError(f"model {name} has a label_filename and {len(outputs)} outputs; a classifier has one output, "
                          "its scores")
    return ChildModel(name, config.max_batch_size, image, outputs, preprocess, labels, scores, inputs,
                      _detector(name, outputs, params),
                      _weights_warning(name, model_dir, params.get("artifact") or config.default_model_filename))


def _weights_warning(name: str, model_dir: Path | None, artifact: str) -> str | None:
    """What to say of a model whose newest engine file (the python backend's `artifact`
    parameter, or a native backend's default_model_filename) was exported with random weights."""
    if model_dir is None or not artifact:
        return None
    for version in version_folders(model_dir):
        weights = exported_weights(Path(model_dir) / version / artifact)
        if weights is not None:
            if weights != "random":
                return None
            return (f"{name} runs an engine exported with random weights ({version}/{artifact}): its labels mean "
                    "nothing; export it with real weights (python -m engine_build export --help)")
    return None


def _looks_like_image(tensor: TensorInfo) -> bool:
    return tensor.dtype == "STRING" or (tensor.dtype in PIXEL_TYPES and len(tensor.dims) == 3)


def _image_input(name: str, inputs: tuple[TensorInfo, ...], params: dict[str, str]) -> TensorInfo | None:
    """The input the runtime feeds from the images, or None (the flow passes every input)."""
    if "image_input" in params:
        chosen = next((t for t in inputs if t.name == params["image_input"].strip()), None)
        if chosen is None:
            raise ConfigError(f"model {name}: parameter image_input={params['image_input']!r} names no input; "
                              f"its inputs: {', '.join(t.name for t in inputs)}")
        if chosen.dtype not in ("STRING", *PIXEL_TYPES):
            raise ConfigError(f"model {name}: image input {chosen.name} is TYPE_{chosen.dtype}; an image input is "
                              f"TYPE_STRING (encoded bytes) or pixels as {', '.join('TYPE_' + t for t in PIXEL_TYPES)}")
        return chosen
    required = [t for t in inputs if not t.optional]
    if len(required) == 1 and _looks_like_image(required[0]):
        return required[0]
    if len(required) == 1 and any(k in params for k in _PREPROCESS_KEYS):
        _preprocess(name, required[0], params)  # preprocess_* keys on an input that is no image: say why
    return None


def _detector(name: str, outputs: tuple[TensorInfo, ...], params: dict[str, str]) -> Detector | None:
    keys = ("boxes_units", "boxes_format", "box_scores_output", "box_classes_output", "count_output")
    if "boxes_output" not in params:
        given = [k for k in keys if k in params]
        if given:
            raise ConfigError(f"model {name}: {', '.join(given)} describe a detector's boxes; add boxes_output (the "
                              "output holding them) or remove them")
        return None
    by_name = {o.name: o for o in outputs}

    def output(key: str, dims: int, last: int | None = None) -> str | None:
        if key not in params:
            return None
        value = params[key].strip()
        o = by_name.get(value)
        if o is None:
            raise ConfigError(f"model {name}: parameter {key}={value!r} names no output; its outputs: "
                              f"{', '.join(by_name)}")
        if len(o.dims) != dims or (last is not None and o.dims[-1] != last):
            want = {("boxes_output", 2): "[-1, 4]", ("count_output", 1): "[1]"}.get((key, dims), "[-1]")
            raise ConfigError(f"model {name}: output {o.name} ({key}) has dims {list(o.dims)}; it needs {want} "
                              "(per image, without the batch dimension)")
        return value

    units = params.get("boxes_units", "").strip().lower()
    if units not in BOX_UNITS:
        raise ConfigError(f"model {name}: parameter boxes_units={units!r}: write pixels or normalized (0..1), of the "
                          "input the detector saw")
    box_format = params.get("boxes_format", "xyxy").strip().lower()
    if box_format not in BOX_FORMATS:
        raise ConfigError(f"model {name}: parameter boxes_format={box_format!r}: write one of {', '.join(BOX_FORMATS)}")
    count = output("count_output", 1, 1)
    return Detector(output("boxes_output", 2, 4), units, box_format, output("box_scores_output", 1),
                    output("box_classes_output", 1), count)


def load_child(repo: Path, name: str, caller_dir: Path | None = None) -> ChildModel:
    """The ChildModel of `name`, a sibling folder in the model repository `repo`; where there
    is none, the copy of its config and labels in the caller's CHILDREN_DIR (`caller_dir`).

    Triton copies a model's own folder, alone, from a remote repository (S3) to local disk:
    there the siblings are absent, and bls-publish puts the copies in each flow model's folder."""
    model_dir = child_folder(repo, name, caller_dir)
    return child_model(name, parse_config(model_dir), model_dir)


def child_folder(repo: Path, name: str, caller_dir: Path | None = None) -> Path:
    """The folder load_child reads `name` from (its config.pbtxt, its label file)."""
    model_dir = Path(repo) / name
    if not (model_dir / "config.pbtxt").is_file() and caller_dir is not None:
        copy = Path(caller_dir) / CHILDREN_DIR / name
        if (copy / "config.pbtxt").is_file():
            model_dir = copy
        else:
            raise ConfigError(f"model {name} has no {model_dir / 'config.pbtxt'} and {Path(caller_dir).name} has no "
                              f"copy in {copy}: fix the setting that names it, or add the model. From a remote "
                              f"repository (S3) Triton copies only {Path(caller_dir).name}'s own folder: publish it "
                              "with bls-publish, "
                              f"which copies the config and labels of every model it calls into {CHILDREN_DIR}/")
    if not (model_dir / "config.pbtxt").is_file():
        raise ConfigError(f"model {name} has no {model_dir / 'config.pbtxt'}: fix the setting that names it, or add "
                          "the model")
    return model_dir


def version_folders(model_dir: Path) -> tuple[str, ...]:
    """The model's version folders (numbered sub-folders), newest first."""
    try:
        names = [p.name for p in Path(model_dir).iterdir() if p.is_dir() and p.name.isdigit()]
    except OSError:
        return ()
    return tuple(sorted(names, key=int, reverse=True))
