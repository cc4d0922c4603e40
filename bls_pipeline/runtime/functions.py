"""A python child model whose work is one numpy function, named by its `function` parameter.

    parameters { key: "function", value: { string_value: "quality_measures.py:measure" } }

The file sits in the model's version folder; the function takes {input name: batch} and
returns {output name: batch}. A file that needs something opened once (an ONNX session, a
vocabulary) does it in a function `setup()`, run when the model loads, so that a missing or
broken file fails the load, not a request. Inside Triton, adapter.function_model runs it;
LocalFlow runs the same function in process, so a flow's python children need no stand-in in tests.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Callable

from .settings import ConfigError

__all__ = ["FUNCTION_PARAMETER", "load_function"]

FUNCTION_PARAMETER = "function"


def load_function(version_dir: Path, spec: str) -> Callable[[dict], dict]:
    """`spec` ("file.py:name") from `version_dir`, imported under a name of its own."""
    file, _, name = spec.partition(":")
    path = Path(version_dir) / file
    if not name or not file.endswith(".py"):
        raise ConfigError(f"parameter {FUNCTION_PARAMETER}={spec!r}: write file.py:function, e.g. \"measures.py:measure\"")
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
