"""Child calls through the python backend: the one place a flow's requests meet pb_utils.

One request goes out with `exec()`; several (a flow's `together`, or one call chunked at
the child's max_batch_size) go out with `async_exec()` and are awaited together on this
model instance's own event loop, so they are in flight at the same time. Inputs cross as
numpy arrays, or as CUDA tensors through DLPack; a request with `output_gpu` asks for its
outputs in that GPU's memory (preferred_memory) and gets them back as torch tensors there,
one without it asks for them in host memory.
A failed call comes back as a ChildCallError with the server's message, marked
`unavailable` when the server says the model could not take it at all (its stub died, it
or the version asked for is unloading or gone): the runtime retries those; `busy` when it
refused the call for overload. Triton hands a BLS caller the message alone (its code is
lost): the words are base/messages.py's. With `trace` set, each call is a child of that trace.
"""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

from ..base.messages import BUSY, UNAVAILABLE
from ..runtime import hooks
from ..runtime.call.calls import ChildRequest
from ..runtime.errors import ChildCallError
from .glue import tensor_from_numpy, tensor_to_array, tensor_to_numpy

__all__ = ["TritonTransport", "child_error"]



def child_error(message: str, model: str | None = None) -> ChildCallError:
    """The ChildCallError for a failed child call's message: unavailable (retried) or busy
    (overloaded) when it says so, else the child's own failure."""
    return ChildCallError(message, unavailable=bool(UNAVAILABLE.search(message)), busy=bool(BUSY.search(message)),
                          model=model)


class TritonTransport:
    def __init__(self, pb_utils: Any):
        self._pb = pb_utils
        self._loop: asyncio.AbstractEventLoop | None = None
        # The pb_utils.InferenceTrace of the request whose trace the calls join (set by the
        # adapter for one execute(), while that request lives), or None: not traced.
        self.trace = None

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()
            self._loop = None

    def send(self, requests: Sequence[ChildRequest]) -> list:
        with hooks.stage("child_inputs"):
            built = [self._request(r) for r in requests]
        with hooks.stage("child_exec"):
            if len(built) == 1:
                responses = [self._exec(built[0])]
            else:
                if self._loop is None:
                    self._loop = asyncio.new_event_loop()
                responses = self._loop.run_until_complete(self._exec_together(built))
        with hooks.stage("child_outputs"):
            outputs = [self._outputs(resp, req) for resp, req in zip(responses, requests)]
            _wait_for_copies(outputs)
            return outputs

    def _request(self, req: ChildRequest) -> Any:
        inputs = [tensor_from_numpy(self._pb, name, array) for name, array in req.inputs.items()]
        options = {}
        if req.output_gpu is not None:
            options["preferred_memory"] = self._pb.PreferredMemory(self._pb.TRITONSERVER_MEMORY_GPU, req.output_gpu)
        else:
            # A flow on the CPU asks for host memory: a child on a GPU (resnet50_torch, a plan)
            # answers through Triton's copy, and this stub never makes a CUDA context of its
            # own to copy the logits (about 1 GiB of GPU memory per stub).
            options["preferred_memory"] = self._pb.PreferredMemory(self._pb.TRITONSERVER_MEMORY_CPU, 0)
        if req.version:
            options["model_version"] = int(req.version)
        if req.timeout_s is not None:  # the child's queue lets it go once its requests' clients are gone
            options["timeout"] = max(1, int(req.timeout_s * 1e6))
        if self.trace is not None:  # Triton records this call as a child of that request's trace
            options["trace"] = self.trace
        return self._pb.InferenceRequest(model_name=req.model, requested_output_names=list(req.outputs), inputs=inputs,
                                         **options)

    @staticmethod
    def _exec(request: Any) -> Any:
        try:
            return request.exec()
        except Exception as exc:  # noqa: BLE001 - e.g. pb_utils.TritonModelException: a failed call
            return child_error(str(exc) or type(exc).__name__)

    @staticmethod
    async def _exec_together(requests: list) -> list:
        # async_exec runs each exec() in the loop's executor: all are in flight at once.
        outcomes = await asyncio.gather(*(_async_exec(r) for r in requests), return_exceptions=True)
        return [child_error(str(o) or type(o).__name__) if isinstance(o, BaseException) else o for o in outcomes]

    def _outputs(self, response: Any, req: ChildRequest):
        if isinstance(response, ChildCallError):
            return response
        if response.has_error():
            return child_error(response.error().message(), req.model)
        out = {}
        for name in req.outputs:
            tensor = self._pb.get_output_tensor_by_name(response, name)
            if tensor is None:
                return ChildCallError(f"{req.model} returned no {name} output", model=req.model)
            if tensor.is_cpu():
                out[name] = tensor.as_numpy().copy()  # own it: the buffer goes with the response
            elif req.output_gpu is None:
                # A flow on the CPU calling a child that answers in GPU memory (a KIND_GPU
                # python model): copied to host here, as numpy, which the HostDevice works in.
                out[name] = tensor_to_numpy(tensor)
            else:
                out[name] = tensor_to_array(tensor).clone()
        return out


async def _async_exec(request: Any) -> Any:
    """request.async_exec(), with what it raises before it is even in flight kept as the
    outcome, like what it raises while in flight."""
    return await request.async_exec()


def _wait_for_copies(outputs: list) -> None:
    """GPU outputs were copied out of their responses' buffers asynchronously: wait for the
    copies before the responses (and so those buffers) are released and reused."""
    for out in outputs:
        if isinstance(out, dict):
            for value in out.values():
                if getattr(value, "is_cuda", False):
                    import torch

                    torch.cuda.current_stream(value.device).synchronize()
                    return
