"""The Triton model behind every flow folder: pb_utils in and out, the flow runtime in between.

models/<name>/1/model.py is the same three lines everywhere:

    import triton_python_backend_utils as pb_utils
    from bls_pipeline.adapter import flow_model
    TritonPythonModel = flow_model(pb_utils)

All requests of one execute() go through the flow together (one batched child request
per call); a bad image or a failed flow fails only the requests it touched. The model's
instance_group picks where the pixels are made: KIND_CPU decodes with numpy on the CPU,
KIND_GPU decodes JPEGs on that instance's GPU and keeps pixels and scores there
(runtime/decode/device.py).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from ..contract import CLASS_IDS, EXECUTIONS_ENV, IMAGE, LABELS, MODEL_STATES_ENV, ROUTE, SCORES, TOPK
from ..runtime.load import states_file
from ..runtime.engine import FlowRuntime
from ..runtime.call.in_process import InProcessChildren
from ..runtime.results import BAD_INPUT, BROKEN, CANCELLED, UNAVAILABLE, ImageRequest, Prediction
from .glue import (bridge_logging, declared_outputs, freeze_startup_objects, instance_count, instance_device, is_probe,
                   model_parameters, request_parameters)
from .metrics import FlowMetrics
from .records import ExecuteTimes, RecordSink, TimedSend, execution_record, line
from .queue_waits import QueueWaits
from .transport import TritonTransport

__all__ = ["flow_model"]

log = logging.getLogger(__name__)



def flow_model(pb_utils: Any) -> type:
    """The TritonPythonModel class of a flow model, bound to this stub's pb_utils."""

    class TritonPythonModel:
        def initialize(self, args):
            bridge_logging(pb_utils)
            model_dir = Path(args["model_repository"])
            self.queue_waits = QueueWaits()  # Triton's measure of the queues (its own, its children's), from bls-serve
            self.runtime = FlowRuntime.load(model_dir, model_parameters(args), pb_utils.is_model_ready,
                                            version=args["model_version"], instances=instance_count(args),
                                            name=args["model_name"], device=instance_device(args), pin_versions=True,
                                            outputs=declared_outputs(args), queued=True,
                                            queue_readings=self.queue_waits.read)
            self.transport = TritonTransport(pb_utils)
            self.send = self.transport.send
            self.in_process = None
            settings = self.runtime.options
            if settings.run_in_process and instance_device(args) is not None:
                log.info("%s: run_in_process is for KIND_CPU instances; on %s every call goes through Triton",
                         args["model_instance_name"], instance_device(args))
            elif settings.run_in_process:  # children whose engines this instance runs itself
                lists = [tuple(c) for c in self.runtime.settings.candidate_lists()]
                # a shadow's calls go to Triton
                lists += [(settings.canary.model,)] if settings.canary is not None else []
                self.in_process = InProcessChildren(args["model_name"], model_dir.parent, settings.run_in_process,
                                                    lists)
                self.send = self.in_process.send(self.transport.send)
            self.send = TimedSend(self.send)  # the child calls' wall time, for the execute() record
            if self.runtime.shadow is not None:  # mirrored calls: on the shadow's thread, their own transport
                self.mirror_transport = TritonTransport(pb_utils)
                self.runtime.router.mirror_send = self.mirror_transport.send
            self.metrics = FlowMetrics(pb_utils, args["model_name"], args["model_instance_name"],
                                       stages=tuple(self.runtime.children))
            self.instance = args["model_instance_name"]
            self.records = RecordSink(os.environ.get(EXECUTIONS_ENV))  # bls-serve's, for bls-explain
            # A candidate that failed to load makes a request INTERNAL, not UNAVAILABLE (bls-serve's states).
            self.runtime.failed_loads = states_file.reader(os.environ.get(MODEL_STATES_ENV))
            # A child loaded again with another config is called as served now (bls-serve's states).
            self.served = states_file.ServedConfigs(os.environ.get(MODEL_STATES_ENV))
            freeze_startup_objects()

        def execute(self, requests):
            # Health probes (the watchdog's) run apart from users' requests, unmetered (the
            # bls_* counters count users' traffic only) and on the stable models alone. Beside
            # users' requests that were answered, they are answered from that run: this stub and
            # the models it called just worked, and the users' responses, sent together with the
            # probes', would otherwise wait for a run of their own (measured: up to 0.5 s here).
            served = self.served.changed()
            if served:
                self.runtime.follow_children(served)
            times = ExecuteTimes()
            sent = set()  # requests answered at the door, before the others' run

            def answer_now(door_results: list, part: list[int]) -> None:
                # Refused before any work (gone, shed, a bad parameter): answered now, through
                # the request's response sender, not after the run of the requests kept.
                for i, res in zip(part, door_results):
                    if res is not None and i not in sent:
                        sender = requests[i].get_response_sender()
                        sender.send(_respond(pb_utils, res, set()), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                        sent.add(i)

            params = [request_parameters(r) for r in requests]  # read once: the probe flag, then the flow's
            probe = [is_probe(r, p) for r, p in zip(requests, params)]
            results = [None] * len(requests)
            users = ([], [], None)  # the users' request ids, answers and timings, for the record
            for probing in (False, True):
                part = [i for i, p in enumerate(probe) if p == probing]
                if not part:
                    continue
                if probing and any(isinstance(a, Prediction) for a in users[1]):
                    for i in part:
                        results[i] = _ANSWERED_BESIDE
                    continue
                # Every child call of this run serves all of its requests: it joins the trace
                # of the first (docs/reliability.md, "Tracing"). The trace lives as long as
                # that request, so only calls made within this execute() may carry it.
                self.transport.trace = requests[part[0]].trace()
                try:
                    inputs = [_read(pb_utils, requests[i], params[i]) for i in part]
                    times.lap("read")
                    answers, timings = self.runtime.run(inputs, self.send, probe=probing,
                                                        at_door=lambda res: answer_now(res, part))
                finally:
                    self.transport.trace = None
                run_ms, child_seconds = times.lap("probes" if probing else None), self.send.take()
                if not probing:
                    times.users(run_ms, timings, child_seconds)
                    self.metrics.record(timings, answered=sum(isinstance(a, Prediction) for a in answers),
                                        gone=timings.answered_gone)
                    times.lap("metrics")
                    users = ([requests[i].request_id() for i in part], answers, timings)
                for i, answer in zip(part, answers):
                    results[i] = answer
            # One response per request: None for one answered at the door already.
            responses = [None if i in sent else _respond(pb_utils, res, set(r.requested_output_names()))
                         for i, (res, r) in enumerate(zip(results, requests))]
            assert len(responses) == len(requests), "one response per request"
            times.lap("responses")
            if self.runtime.options.log_executions or self.records.active:  # else nobody reads it: not built
                record = line(execution_record(self.runtime.name, self.instance, times, time.monotonic_ns(), *users,
                                               probes=sum(probe),
                                               in_process=self.in_process.models if self.in_process else ()))
                if self.runtime.options.log_executions:
                    log.info("%s", record)
                self.records.send(record)
            return responses

        def finalize(self):
            self.metrics.close()
            self.records.close()
            self.runtime.close()
            self.queue_waits.close()
            self.transport.close()
            if self.in_process is not None:
                self.in_process.close()
            if self.runtime.shadow is not None:
                self.mirror_transport.close()

    return TritonPythonModel


def _read(pb_utils: Any, request: Any, parameters: dict) -> ImageRequest:
    image = pb_utils.get_input_tensor_by_name(request, IMAGE.name)
    topk = pb_utils.get_input_tensor_by_name(request, TOPK.name)
    timeout_us = request.timeout()  # Triton's `timeout` request parameter, microseconds (0: none)
    return ImageRequest(
        images=[] if image is None else list(image.as_numpy().reshape(-1)),  # none: the runtime says so
        topk=None if topk is None else tuple(int(k) for k in topk.as_numpy().reshape(-1)),
        outputs=frozenset(request.requested_output_names()),  # all of them when the client named none
        id=request.request_id(),
        parameters=parameters,
        timeout_s=timeout_us / 1e6 if timeout_us else None,
        cancelled=request.is_cancelled,
    )


# A probe answered from the users' run beside it: a response with no outputs (the watchdog
# reads only whether it failed).
_ANSWERED_BESIDE = object()


def _respond(pb_utils: Any, result, wanted: set[str]) -> Any:
    """Only the outputs the client asked for (Triton lists all of them when it named none)."""
    if result is _ANSWERED_BESIDE:
        return pb_utils.InferenceResponse(output_tensors=[])
    if not isinstance(result, Prediction):
        error = pb_utils.TritonError
        code = {BAD_INPUT: error.INVALID_ARG, BROKEN: error.INTERNAL, UNAVAILABLE: error.UNAVAILABLE,
                CANCELLED: error.CANCELLED}[result.code]
        return pb_utils.InferenceResponse(error=error(result.message, code))
    values = {LABELS.name: result.labels, SCORES.name: result.scores, CLASS_IDS.name: result.class_ids,
              ROUTE.name: result.routes, **result.outputs}
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(name, v) for name, v in values.items()
                                                      if name in wanted])
