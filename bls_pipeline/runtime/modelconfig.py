"""A model's config.pbtxt, parsed into Triton's own ModelConfig message.

The one place that reads config.pbtxt files: the runtime (a flow's child models), the
launcher (what to load, in which order to drain) and the tools all go through here.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

__all__ = ["ModelConfig", "config_variant", "data_type", "parse_config", "string_parameters"]

ModelConfig = model_config_pb2.ModelConfig


def parse_config(model_dir: Path) -> ModelConfig:
    path = Path(model_dir) / "config.pbtxt"
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


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
