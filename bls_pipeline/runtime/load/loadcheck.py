"""The load check: run a flow once, at load, on a probe image with stand-in child answers.

No child model is called (BLS is not allowed in initialize()): each call gets zeros shaped
as the child's config declares, and every declared model counts as READY. A flow that
calls a model it did not declare, asks classify() of a model without labels, raises, or
leaves the probe unanswered fails the load with the reason, instead of failing requests
later. It sees the branches that the probe's stand-in answers lead to, not every branch.
"""

from __future__ import annotations

import io
import logging

import numpy as np
from PIL import Image

from ...base.dtypes import numpy_dtype
from ..call.calls import ChildRequest
from ..results import ImageRequest, RequestError
from ...base.errors import ConfigError

__all__ = ["check_flow"]

log = logging.getLogger(__name__)

def _probe_image() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (48, 32), (120, 120, 120)).save(buf, "PNG")
    return buf.getvalue()


def _stand_in(runtime):
    def send(requests: list[ChildRequest]):
        replies = []
        for req in requests:
            child = runtime.children[req.model]
            n = len(next(iter(req.inputs.values())))
            outputs = {}
            for o in child.outputs:
                if o.name in req.outputs:
                    shape = (n, *[max(d, 1) for d in o.dims])
                    outputs[o.name] = (np.full(shape, b"", dtype=object) if o.dtype in ("STRING", "BYTES")
                                       else np.zeros(shape, dtype=numpy_dtype(o.dtype, np.float32)))
            replies.append(outputs)
        return replies
    return send


def check_flow(runtime) -> None:
    """Raise ConfigError if the flow fails on the probe image; close the runtime either way."""
    try:
        (result,), _ = runtime.run([ImageRequest([_probe_image()])], _stand_in(runtime))
    finally:
        runtime.close()
    if isinstance(result, RequestError):
        raise ConfigError(f"flow {runtime.name} ({runtime.flow.path}) failed its load check on a probe image, "
                          f"with every declared model standing in as READY: {result.message}")
