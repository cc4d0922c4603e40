import importlib.util

import pytest


def _why_not() -> str | None:
    if importlib.util.find_spec("tensorrt") is None:
        return "TensorRT's Python package is not installed (it ships in NGC tritonserver images)"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU visible"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _why_not()
    for item in items:
        if "gpu" in item.keywords and reason:
            item.add_marker(pytest.mark.skip(reason=reason))
