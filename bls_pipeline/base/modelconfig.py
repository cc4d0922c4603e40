"""A model's config.pbtxt, parsed into Triton's own ModelConfig message.

The one place that reads config.pbtxt files: the runtime (a flow's child models), the
launcher (what to load, in which order to drain) and the tools all go through here.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from google.protobuf import text_format

__all__ = ["BACKEND_KEYS", "ConfigFileError", "ModelConfig", "RELOAD_KEY", "config_variant", "data_type",
           "parse_config", "served_config", "string_parameters"]


class ConfigFileError(ValueError):
    """A config.pbtxt that cannot be read as a ModelConfig (it does not parse, has a field
    ModelConfig lacks, is not UTF-8 text, or is not a readable file); the message names the
    file, then the reason, on one line."""


def _model_config_pb2():
    """Triton's ModelConfig protobuf module, as tritonclient ships it, imported by itself:
    `from tritonclient.grpc import model_config_pb2` would first run tritonclient.grpc's
    __init__, which imports grpc and the whole gRPC client, about 9 MB of private memory in
    every python stub that reads a config. The classes are the same either way (protobuf
    keeps one descriptor per .proto file)."""
    if "tritonclient.grpc.model_config_pb2" in sys.modules:
        return sys.modules["tritonclient.grpc.model_config_pb2"]
    spec = importlib.util.find_spec("tritonclient")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("reading config.pbtxt needs tritonclient: pip install tritonclient")
    path = Path(list(spec.submodule_search_locations)[0]) / "grpc" / "model_config_pb2.py"
    module_spec = importlib.util.spec_from_file_location("bls_pipeline_model_config_pb2", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


model_config_pb2 = _model_config_pb2()
ModelConfig = model_config_pb2.ModelConfig

# Set by the launcher's reload, never read: a load whose config differs from the one served
# is what makes Triton load a fresh copy beside the serving one (serve/server.py).
RELOAD_KEY = "reload_generation"
# Parameters Triton's python backend reads itself (the model's execution environment:
# bls-pack-env writes it): neither the runtime's nor a model's own, so no setting of theirs.
BACKEND_KEYS = ("EXECUTION_ENV_PATH",)


def parse_config(model_dir: Path) -> ModelConfig:
    """model_dir's config.pbtxt; ConfigFileError naming the file where it cannot be read."""
    path = Path(model_dir) / "config.pbtxt"
    try:
        return text_format.Parse(path.read_text(encoding="utf-8"), model_config_pb2.ModelConfig())
    # its text: "3:20 : 'max_batch_size: 64 {': Expected identifier or number, got {."
    except text_format.ParseError as exc:
        where = f"{path}:{exc.GetLine()}:{exc.GetColumn()}" if exc.GetLine() else str(path)
        reason = str(exc).split(" : ", 1)[-1] if exc.GetLine() else str(exc)
        raise ConfigFileError(f"{where}: {' '.join(reason.split())}") from None
    except UnicodeDecodeError as exc:
        raise ConfigFileError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def served_config(served: dict) -> ModelConfig:
    """A config as Triton serves it (its JSON, GET /v2/models/<model>/config) as a ModelConfig;
    ValueError where it is not one."""
    from google.protobuf import json_format

    try:
        return json_format.ParseDict(served, model_config_pb2.ModelConfig(), ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise ValueError(str(exc)) from None


def string_parameters(config: ModelConfig) -> dict[str, str]:
    """`parameters` as a plain {key: string_value} dict (Triton's parameters hold strings)."""
    return {key: value.string_value for key, value in config.parameters.items()}


def data_type(tensor) -> str:
    """A config tensor's data type without the TYPE_ prefix ("FP32", "STRING", ...)."""
    return model_config_pb2.DataType.Name(tensor.data_type).replace("TYPE_", "")


def config_variant(model_dir: Path, name: str, params: dict[str, str]) -> str:
    """model_dir's config.pbtxt renamed to `name`, with these string parameters set or added
    (how the tests and bls-bench make variants of a flow model: same code, other settings)."""
    config = parse_config(model_dir)
    config.name = name
    for key, value in params.items():
        config.parameters[key].string_value = value
    return text_format.MessageToString(config)
