"""The Triton model behind every *_openvino folder: one OpenVINO inference per execute() batch.

    import triton_python_backend_utils as pb_utils
    from bls_pipeline.adapter import openvino_model
    TritonPythonModel = openvino_model(pb_utils)

The IR (model.xml, with model.bin beside it) is the `artifact` parameter's, in the version
folder; its inputs and outputs (names, data types, dims) are checked against the model's
own config.pbtxt at load.
"""

from __future__ import annotations

from typing import Any

from .onnx_model import batch_model

__all__ = ["openvino_model"]


def openvino_model(pb_utils: Any) -> type:
    return batch_model(pb_utils, "openvino")
