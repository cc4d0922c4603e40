"""ONNX -> TensorRT plan with the TensorRT Python API, and the matching max_batch_size.

A plan is specific to the GPU model and TensorRT version it was built with: build it
on the machine that serves it (the Dockerfile does this at container start).
"""

from __future__ import annotations

import re
from pathlib import Path

from bls_pipeline.contract import CLASSIFIER_INPUT

__all__ = ["TensorRTUnavailable", "build_plan", "set_max_batch_size"]


class TensorRTUnavailable(RuntimeError):
    pass


def _require_tensorrt():
    try:
        import tensorrt as trt
    except ImportError as exc:
        raise TensorRTUnavailable(
            "TensorRT's Python package is not installed here. Build the plan inside the NGC "
            "tritonserver container (see Dockerfile) or on a GPU machine with `pip install tensorrt`."
        ) from exc
    return trt


def _progress_monitor(trt):
    """A tqdm bar per builder phase (TensorRT >= 10 has IProgressMonitor)."""
    if not hasattr(trt, "IProgressMonitor"):
        return None
    from tqdm import tqdm

    class Monitor(trt.IProgressMonitor):
        def __init__(self):
            trt.IProgressMonitor.__init__(self)
            self.bars = {}

        def phase_start(self, phase_name, parent_phase, num_steps):
            self.bars[phase_name] = tqdm(total=num_steps, desc=phase_name, leave=parent_phase is None)

        def phase_finish(self, phase_name):
            bar = self.bars.pop(phase_name, None)
            if bar is not None:
                bar.close()

        def step_complete(self, phase_name, step):
            bar = self.bars.get(phase_name)
            if bar is not None:
                bar.n = step + 1
                bar.refresh()
            return True  # False would cancel the build

    return Monitor()


def build_plan(onnx_path: Path, plan_path: Path, *, fp16: bool, min_batch: int, opt_batch: int, max_batch: int,
               workspace_gib: float = 4.0) -> None:
    if not 1 <= min_batch <= opt_batch <= max_batch:
        raise ValueError(f"need 1 <= min <= opt <= max batch, got {min_batch}/{opt_batch}/{max_batch}")
    if not Path(onnx_path).exists():
        raise FileNotFoundError(f"{onnx_path} is missing: run `python -m engine_build export` first")
    trt = _require_tensorrt()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    major = int(trt.__version__.split(".")[0])
    flags = 0 if major >= 10 else 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT could not parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gib * (1 << 30)))
    if fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    profile = builder.create_optimization_profile()
    chw = CLASSIFIER_INPUT.dims
    profile.set_shape(CLASSIFIER_INPUT.name, (min_batch, *chw), (opt_batch, *chw), (max_batch, *chw))
    config.add_optimization_profile(profile)
    monitor = _progress_monitor(trt)
    if monitor is not None:
        config.progress_monitor = monitor
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError("TensorRT failed to build the engine (see the messages above)")
    plan_path = Path(plan_path)
    plan_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = plan_path.with_suffix(".plan.tmp")
    tmp.write_bytes(bytes(serialized))
    tmp.replace(plan_path)


def set_max_batch_size(config_path: Path, max_batch: int) -> None:
    """Rewrite `max_batch_size: N` in a config.pbtxt to the engine profile's max."""
    text = Path(config_path).read_text()
    new, count = re.subn(r"(?m)^max_batch_size:\s*\d+", f"max_batch_size: {max_batch}", text)
    if count != 1:
        raise ValueError(f"{config_path} has {count} max_batch_size lines; expected exactly one")
    Path(config_path).write_text(new)
