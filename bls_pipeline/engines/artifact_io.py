"""An engine file's inputs and outputs against its model's config.pbtxt, checked at load.

Triton serves a model by its config: the names, data types and dims a caller sends and
receives. The engine behind it (an ONNX file for onnxruntime, an OpenVINO IR) has its
own. When the two disagree, every request that reaches the model fails, or worse, a flow
reads outputs of another shape. So a model that runs an engine compares both sides when
it loads (adapter/onnx_model.py inside Triton, LocalFlow in a test), and a difference
fails the load, naming the model, the tensor and both sides.

Dims: the config's leave out the batch dimension when max_batch_size > 0; the file's
first dim is then the batch, which must be dynamic (or the one size the config allows).
A dim dynamic on either side (-1 in the config; a name or None in the file) agrees with
any size; two fixed sizes must be equal.

Beside the file, engine_build writes a stamp (FILE.json) of the weights it was exported
with: exported_weights reads it, so a model on random weights says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..base.dtypes import ONNX_TYPES, OPENVINO_TYPES
from ..base.tensors import TensorInfo
from ..base.modelconfig import ModelConfig, data_type
from ..base.errors import ConfigError

__all__ = ["Declared", "FileTensor", "exported_weights", "onnx_tensors", "openvino_tensors",
           "stamp_path"]

@dataclass(frozen=True)
class FileTensor:
    """One input or output as the engine file has it: batch dimension included."""

    name: str
    dtype: str  # Triton's word (FP32, UINT8, STRING...), or the file's own when Triton has none
    dims: tuple  # of int, or None where dynamic

    def shown(self) -> str:
        return f"{self.dtype} {[-1 if d is None else d for d in self.dims]}"


@dataclass(frozen=True)
class Declared:
    """A model's inputs and outputs as its config.pbtxt declares them."""

    model: str
    max_batch_size: int
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]

    @classmethod
    def from_config(cls, name: str, config: ModelConfig) -> "Declared":
        def infos(tensors):
            return tuple(TensorInfo(t.name, data_type(t), tuple(t.dims)) for t in tensors)

        return cls(name, config.max_batch_size, infos(config.input), infos(config.output))

    @classmethod
    def from_json(cls, config: dict | str) -> "Declared":
        """From the model config Triton hands a python model (args["model_config"])."""
        config = json.loads(config) if isinstance(config, str) else config

        def infos(tensors):
            return tuple(TensorInfo(t["name"], t["data_type"].replace("TYPE_", ""),
                                    tuple(int(d) for d in t.get("dims", [])))
                         for t in tensors)

        return cls(config["name"], int(config.get("max_batch_size", 0)), infos(config.get("input", [])),
                   infos(config.get("output", [])))

    @property
    def names(self) -> tuple[list[str], list[str]]:
        """The input names and the output names."""
        return [t.name for t in self.inputs], [t.name for t in self.outputs]

    def check(self, source: str, inputs: Sequence[FileTensor], outputs: Sequence[FileTensor]) -> None:
        """ConfigError naming the first tensor whose name, data type or dims differ."""
        for kind, declared, found in (("input", self.inputs, inputs), ("output", self.outputs, outputs)):
            by_name = {t.name: t for t in found}
            missing = [t.name for t in declared if t.name not in by_name]
            extra = sorted(set(by_name) - {t.name for t in declared})
            if missing or (extra and kind == "input"):
                have = ", ".join(f"{t.name} ({t.shown()})" for t in found) or "none"
                raise ConfigError(f"model {self.model}: its config.pbtxt declares {kind}(s) "
                                  f"{', '.join(t.name for t in declared)}, and {source} has {have}: re-export it or "
                                  "fix the config")
            for info in declared:
                problem = self._differs(info, by_name[info.name])
                if problem:
                    raise ConfigError(f"model {self.model}: {kind} {info.name}: its config.pbtxt declares "
                                      f"{self._shown(info)}, and {source} has {by_name[info.name].shown()} "
                                      f"({problem}): re-export it or fix the config")

    def _shown(self, info: TensorInfo) -> str:
        batch = f", max_batch_size {self.max_batch_size}" if self.max_batch_size > 0 else ""
        return f"TYPE_{info.dtype} dims {list(info.dims)}{batch}"

    def _differs(self, info: TensorInfo, found: FileTensor) -> str | None:
        want = "STRING" if info.dtype == "BYTES" else info.dtype
        if found.dtype != want:
            return "data types differ"
        dims = found.dims
        if self.max_batch_size > 0:
            if not dims:
                return "the file has no batch dimension"
            batch, dims = dims[0], dims[1:]
            if batch is not None and batch < self.max_batch_size:
                return f"its batch dimension is fixed at {batch}, under max_batch_size {self.max_batch_size}"
        if len(dims) != len(info.dims):
            return f"{len(info.dims)} dims against {len(dims)}"
        for i, (want_dim, have) in enumerate(zip(info.dims, dims)):
            if want_dim >= 0 and have is not None and want_dim != have:
                return f"dim {i} is {want_dim} against {have}"
        return None


def onnx_tensors(args: Sequence) -> list[FileTensor]:
    """onnxruntime's NodeArgs (session.get_inputs() / get_outputs()) as FileTensors."""
    out = []
    for arg in args:
        kind = arg.type[len("tensor("):-1] if arg.type.startswith("tensor(") else arg.type
        dims = tuple(d if isinstance(d, int) and d >= 0 else None for d in (arg.shape or ()))
        out.append(FileTensor(arg.name, ONNX_TYPES.get(kind, kind), dims))
    return out


def openvino_tensors(ports: Sequence, names: Sequence[str]) -> list[FileTensor]:
    """OpenVINO ports as FileTensors, each named by the one of `names` it carries (else its own)."""
    out = []
    for port in ports:
        name = next((n for n in names if n in port.get_names()), port.get_any_name())
        kind = port.get_element_type().get_type_name()
        dims = tuple(d.get_length() if d.is_static else None for d in port.get_partial_shape())
        out.append(FileTensor(name, OPENVINO_TYPES.get(kind, kind), dims))
    return out


def stamp_path(path: Path) -> Path:
    """Where engine_build writes what an engine file was built from: FILE.json beside FILE."""
    path = Path(path)
    return path.with_name(path.name + ".json")


def exported_weights(path: Path) -> str | None:
    """The weights an engine file written by engine_build carries ('imagenet', 'pretrained',
    'random', a .pth path), from its stamp beside it (FILE.json); 'unknown' without a stamp,
    None without the file."""
    path = Path(path)
    if not path.exists():
        return None
    stamp = stamp_path(path)
    try:
        return str(json.loads(stamp.read_text())["weights"]) if stamp.exists() else "unknown"
    except (ValueError, KeyError, TypeError):
        return "unknown"
