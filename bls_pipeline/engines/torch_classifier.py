"""A torchvision classifier from a state dict, run by torch: the logic behind models/*_torch.

On CUDA it runs in FP16 (or FP32) with channels-last activations (tensor cores) and returns
float32 logits on the GPU; on the CPU (a dry run without a GPU) it runs in FP32 and says so.
On CUDA a batch is padded up to its bucket (powers of two up to max_batch_size), and every
bucket runs once at load: cuDNN autotunes each input shape at its first batch (about a
second on an H100), so a batch size first seen under load would stall its requests.
Two options, off by default here: CUDA graphs (one captured per bucket at load; on in
resnet50_torch's config.pbtxt, where an H100 measured it faster, docs/gpu.md) and
torch.compile (the same buckets, compiled at load; not measured). Inputs may be numpy
arrays or tensors on any device; a batch over max_batch_size runs in chunks.

`TorchSettings.parse` reads the model's config.pbtxt `parameters` (no torch needed);
`TorchClassifier` imports torch when built.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .artifact_io import exported_weights
from ..base.modelconfig import BACKEND_KEYS, RELOAD_KEY
from ..base.errors import ConfigError

__all__ = ["TorchClassifier", "TorchSettings"]

log = logging.getLogger(__name__)

# Parameters a *_torch model may set besides these (read elsewhere): the python backend's
# own, the launcher's reload mark and the preprocessing the flows read.
_OTHER_KEYS = ("FORCE_CPU_ONLY_INPUT_TENSORS", *BACKEND_KEYS, RELOAD_KEY)
_OTHER_PREFIX = "preprocess_"
_SWITCHES = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


@dataclass(frozen=True)
class TorchSettings:
    artifact: str = "model.pt"  # the state dict, in the version folder
    architecture: str = "resnet50"  # a torchvision.models name
    precision: str = "fp16"  # on CUDA; the CPU runs fp32
    channels_last: bool = True
    cuda_graphs: bool = False
    compile: bool = False

    @classmethod
    def parse(cls, params: dict[str, str], model: str) -> "TorchSettings":
        known = [f for f in cls.__dataclass_fields__]
        unknown = sorted(k for k in params if k not in known and k not in _OTHER_KEYS
                         and not k.startswith(_OTHER_PREFIX))
        if unknown:
            raise ConfigError(f"unknown parameter(s) {', '.join(unknown)} for model {model}; known: {', '.join(known)}")
        values: dict[str, Any] = {}
        for key in known:
            if key not in params:
                continue
            raw = params[key].strip()
            if isinstance(getattr(cls, key), bool):
                if raw.lower() not in _SWITCHES:
                    raise ConfigError(f"model {model}: parameter {key}={raw!r}: write 1 or 0")
                values[key] = _SWITCHES[raw.lower()]
            else:
                values[key] = raw
        settings = cls(**values)
        if settings.precision not in ("fp16", "fp32"):
            raise ConfigError(f"model {model}: parameter precision={settings.precision!r}: write fp16 or fp32")
        return settings


class TorchClassifier:
    """`architecture` with the state dict at `weights`, on `device`, ready to run batches."""

    def __init__(self, weights: Path, settings: TorchSettings, device: str, max_batch_size: int,
                 input_shape: tuple[int, ...] = (3, 224, 224)):
        try:
            import torch
            import torchvision
        except ImportError as exc:
            raise ImportError("a *_torch model needs torch and torchvision in the stub's Python: "
                              "pip install 'bls-pipeline[build]'") from exc
        weights = Path(weights)
        if not weights.exists():
            raise FileNotFoundError(f"{weights} is missing: write it with python -m engine_build torch --help")
        self._torch = torch
        self.device = torch.device(device)
        self.max_batch_size, self.input_shape = max_batch_size, tuple(input_shape)
        cuda = self.device.type == "cuda"
        if cuda and not torch.cuda.is_available():
            raise RuntimeError(f"{device} was asked for, and torch sees no CUDA device")
        self.dtype = torch.float16 if cuda and settings.precision == "fp16" else torch.float32
        if settings.precision == "fp16" and not cuda:
            log.warning("fp16 needs CUDA: running %s in fp32 on %s", settings.architecture, self.device)
        self.memory_format = torch.channels_last if settings.channels_last else torch.contiguous_format
        model = torchvision.models.get_model(settings.architecture, weights=None)
        state = torch.load(weights, map_location="cpu", weights_only=True)
        model.load_state_dict(state.get("state_dict", state) if isinstance(state, dict) else state)
        self.model = model.eval().to(self.device, dtype=self.dtype, memory_format=self.memory_format)
        if cuda:
            torch.backends.cudnn.benchmark = True  # one autotune per input shape, at its first batch
        self.buckets = _buckets(max_batch_size) if (cuda or settings.compile) else ()
        if settings.compile:
            self.model = torch.compile(self.model, dynamic=False)
        self._graphs: dict[int, tuple[Any, Any, Any]] = {}
        if settings.cuda_graphs:
            if not cuda:
                raise ConfigError("cuda_graphs=1 needs a KIND_GPU instance")
            self._capture()
        else:
            self._warm_up()
        log.info("%s (weights: %s) on %s, %s, %s%s%s", settings.architecture, exported_weights(weights), self.device,
                 str(self.dtype).replace("torch.", ""), "channels-last" if settings.channels_last else "NCHW",
                 ", CUDA graphs" if settings.cuda_graphs else "", ", torch.compile" if settings.compile else "")

    def _input(self, size: int):
        shape = (size, *self.input_shape)
        return self._torch.zeros(shape, dtype=self.dtype,
                                 device=self.device).contiguous(memory_format=self.memory_format)

    def _warm_up(self) -> None:
        """The first batches of each bucket size (or of 1 and max_batch_size) outside the
        request path: CUDA context, cuDNN's autotune, compilation."""
        with self._torch.inference_mode():
            for size in self.buckets or sorted({1, self.max_batch_size}):
                self.model(self._input(size))
        if self.device.type == "cuda":
            self._torch.cuda.synchronize(self.device)

    def _capture(self) -> None:
        torch = self._torch
        pool = None
        for size in self.buckets:
            static_in = self._input(size)
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream), torch.inference_mode():
                for _ in range(3):
                    self.model(static_in)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.inference_mode(), torch.cuda.graph(graph, pool=pool):
                static_out = self.model(static_in)
            pool = graph.pool()
            self._graphs[size] = (graph, static_in, static_out)

    def as_input(self, array) -> Any:
        """A numpy array or tensor (N, 3, H, W) -> a tensor on this model's device (a CUDA
        tensor stays where it is; host memory is copied over)."""
        torch = self._torch
        tensor = array if isinstance(array, torch.Tensor) else torch.from_numpy(array)
        return tensor.to(self.device)

    def __call__(self, batch) -> Any:
        """(N, 3, H, W) on this device -> (N, classes) float32 logits on this device."""
        torch = self._torch
        if len(batch) > self.max_batch_size:
            return torch.cat([self(batch[i:i + self.max_batch_size])
                              for i in range(0, len(batch), self.max_batch_size)])
        x = batch.to(dtype=self.dtype, memory_format=self.memory_format)
        with torch.inference_mode():
            if self._graphs:
                size = next(b for b in self.buckets if b >= len(x))
                graph, static_in, static_out = self._graphs[size]
                static_in[:len(x)].copy_(x)
                graph.replay()
                return static_out[:len(x)].to(torch.float32, copy=True)  # the next replay overwrites static_out
            if self.buckets:  # pad to the bucket: each shape was autotuned (or compiled) at load
                size = next(b for b in self.buckets if b >= len(x))
                padded = x if size == len(x) else torch.cat([x, x.new_zeros((size - len(x), *x.shape[1:]))])
                return self.model(padded)[:len(x)].float()
            return self.model(x).float()


def _buckets(max_batch_size: int) -> tuple[int, ...]:
    sizes, b = [], 1
    while b < max_batch_size:
        sizes.append(b)
        b *= 2
    return tuple(sizes + [max_batch_size])
