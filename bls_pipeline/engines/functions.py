"""A python child model whose work is one numpy function, named by its `function` parameter.

    parameters { key: "function", value: { string_value: "quality_measures.py:measure" } }

The file sits in the model's version folder; the function takes {input name: batch} and
returns {output name: batch}. A file that needs something opened once (an ONNX session, a
vocabulary) does it in a function `setup()`, run when the model loads, so that a missing or
broken file fails the load, not a request. Inside Triton, adapter.function_model runs it;
LocalFlow runs the same function in process, so a flow's python children need no stand-in in tests.
What it returns must keep its config's batch contract (check_outputs): each declared output,
one row per input row, the declared dims and data type; the model refuses anything else as
broken, to every caller, not only to a flow that checks.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..base.dtypes import triton_dtype
from ..base.tensors import TensorInfo
from ..base.errors import ConfigError

__all__ = ["FUNCTION_PARAMETER", "check_outputs", "load_function"]

FUNCTION_PARAMETER = "function"


def load_function(version_dir: Path, spec: str) -> Callable[[dict], dict]:
    """`spec` ("file.py:name") from `version_dir`, imported under a name of its own."""
    file, _, name = spec.partition(":")
    path = Path(version_dir) / file
    if not name or not file.endswith(".py"):
        raise ConfigError(f"parameter {FUNCTION_PARAMETER}={spec!r}: write file.py:function, e.g. "
                          "\"measures.py:measure\"")
    if not path.is_file():
        raise ConfigError(f"parameter {FUNCTION_PARAMETER}={spec!r}: {path} is missing")
    module_spec = importlib.util.spec_from_file_location(f"bls_function_{path.parent.parent.name}_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigError(f"parameter {FUNCTION_PARAMETER}={spec!r}: {path.name} has no function {name}")
    setup = getattr(module, "setup", None)
    if callable(setup):
        setup()
    return fn


def check_outputs(outputs: object, declared: Sequence[TensorInfo], rows: int) -> str | None:
    """Why a function's `outputs` for a batch of `rows` break its config's contract (`declared`:
    its outputs, dims without the batch dimension), or None: every declared output is there,
    an array of `rows` rows with the declared dims (-1: any) and data type."""
    if not isinstance(outputs, dict):
        return f"returned {type(outputs).__name__}, not a dict of outputs"
    for info in declared:
        if info.name not in outputs:
            return f"returned no {info.name} (it returned {', '.join(map(str, outputs)) or 'nothing'})"
        value = np.asarray(outputs[info.name])
        expected = (rows, *info.dims)
        if value.ndim != len(expected) or any(e >= 0 and e != v for e, v in zip(expected, value.shape)):
            return (f"returned {info.name} with shape {tuple(value.shape)} for a batch of {rows}; its config.pbtxt "
                    f"declares dims {list(info.dims)}, so expected {tuple(expected)}")
        got = "STRING" if value.dtype.kind in "OSU" else triton_dtype(value.dtype.name)
        if got != ("STRING" if info.dtype == "BYTES" else info.dtype):
            return f"returned {info.name} as {got}; its config.pbtxt declares TYPE_{info.dtype}"
    return None
