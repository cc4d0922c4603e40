"""gpubench env and stub-check: what this machine has for the GPU path, and whether the
python backend's stub passes FP32, string and CUDA tensors here."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from .gpubench_results import record

__all__ = ["cmd_env", "cmd_stub_check"]


# ---- env -------------------------------------------------------------------------------------
def _version(module: str) -> str | None:
    import importlib

    try:
        mod = importlib.import_module(module)
        return getattr(mod, "__version__", "?")
    except Exception as exc:  # noqa: BLE001 - a broken install reports itself
        return f"import failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"


def nvidia_smi(*query: str) -> list[list[str]] | str:
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi not found"
    proc = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                          timeout=30)
    if proc.returncode != 0:
        return f"nvidia-smi failed: {proc.stderr.strip()[:200]}"
    return [[cell.strip() for cell in line.split(",")] for line in proc.stdout.strip().splitlines() if line.strip()]


def _stub_libraries() -> dict:
    """The python backend stub for this Python and the shared libraries it cannot find
    (libpython above all: the stub embeds this interpreter's)."""
    import importlib.util
    import sysconfig

    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return {"ok": False, "error": "nvidia-pytriton is not installed (its wheel carries tritonserver and the stub)"}
    root = Path(list(spec.submodule_search_locations)[0]) / "tritonserver"
    stub = (root / "python_backend_stubs" / f"{sys.version_info.major}.{sys.version_info.minor}"
            / "triton_python_backend_stub")
    if not stub.exists():
        return {"ok": False,
                "error": f"no python backend stub for Python {sys.version_info.major}.{sys.version_info.minor} in "
                         f"{root}"}
    libs = root.parent.parent / "nvidia_pytriton.libs"
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(
        p for p in (sysconfig.get_config_var("LIBDIR") or "", str(libs), os.environ.get("LD_LIBRARY_PATH", "")) if p))
    if shutil.which("ldd") is None:
        return {"ok": True, "stub": str(stub), "note": "ldd not found: the stub's libraries were not checked"}
    proc = subprocess.run(["ldd", str(stub)], capture_output=True, text=True, env=env, timeout=30)
    missing = [line.split("=>")[0].strip() for line in proc.stdout.splitlines() if "not found" in line]
    result = {"ok": not missing, "stub": str(stub), "libdir": sysconfig.get_config_var("LIBDIR")}
    if missing:
        result["error"] = (f"the stub cannot find {', '.join(missing)}: install the shared library of this Python "
                           "(e.g. the libpython3.x package) or run from a Python that ships it")
    return result


def cmd_env(args) -> int:
    import numpy

    report: dict = {"python": f"{platform.python_version()} ({sys.executable})", "cores": os.cpu_count(),
                    "machine": platform.platform(), "numpy": numpy.__version__, "numpy_path": numpy.__file__}
    for module in ("torch", "torchvision", "PIL", "onnx", "onnxruntime", "onnxscript", "grpc", "google.protobuf"):
        report[module] = _version(module)
    try:
        import tritonclient.grpc  # noqa: F401 - its generated code checks grpcio and protobuf versions

        report["tritonclient.grpc"] = "ok"
    except Exception as exc:  # noqa: BLE001
        report["tritonclient.grpc"] = f"import failed: {type(exc).__name__}: {exc}"
    try:
        import torch

        report["cuda"] = {"available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda,
                          "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
    except Exception as exc:  # noqa: BLE001
        report["cuda"] = f"unknown: {exc}"
    report["gpus"] = nvidia_smi("--query-gpu=name,driver_version,memory.total,clocks.max.sm")
    report["tensorrt"] = "installed" if _spec("tensorrt") else "absent (no TensorRT on this machine)"
    report["stub"] = _stub_libraries()
    problems = []
    if int(numpy.__version__.split(".")[0]) >= 2:
        problems.append(f"numpy {numpy.__version__}: the python backend stub of nvidia-pytriton 0.7.0 (pybind11 2.10) "
                        "needs numpy < 2; install numpy 1.26 first on the path (scripts/gpu/run.sh carries it)")
    if report["tritonclient.grpc"] != "ok":
        problems.append(f"tritonclient.grpc: {report['tritonclient.grpc']}")
    if not report["stub"]["ok"]:
        problems.append(report["stub"]["error"])
    if args.device != "cpu" and not (isinstance(report["cuda"], dict) and report["cuda"]["available"]):
        problems.append("torch sees no CUDA device")
    report["ok"], report["problems"] = not problems, problems
    record(args.out, "env", report)
    for problem in problems:
        print(f"gpubench env: {problem}", file=sys.stderr)
    return 0 if not problems else 1


def _spec(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


# ---- stub-check ------------------------------------------------------------------------------
_ECHO_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "F", data_type: TYPE_FP32, dims: [ 3 ] }}, {{ name: "S", data_type: TYPE_STRING, dims: [ 1 ] }} ]
output [
  {{ name: "F2", data_type: TYPE_FP32, dims: [ 3 ] }}, {{ name: "S2", data_type: TYPE_STRING, dims: [ 1 ] }},
  {{ name: "G3", data_type: TYPE_FP32, dims: [ 3 ] }}, {{ name: "INFO", data_type: TYPE_STRING, dims: [ 1 ] }}
]
instance_group [ {{ count: 1, kind: {kind} }} ]
"""


# The stub check's model: numpy and string tensors in and out; on a GPU instance, a CUDA
# tensor out through DLPack. Written to a temporary repository, never served otherwise.
_ECHO_MODEL = '''import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.kind = args["model_instance_kind"]

    def execute(self, requests):
        responses = []
        for request in requests:
            f = pb_utils.get_input_tensor_by_name(request, "F").as_numpy()
            s = pb_utils.get_input_tensor_by_name(request, "S").as_numpy()
            info = {"numpy": np.__version__, "kind": self.kind}
            tensors = [pb_utils.Tensor("F2", (f * 2).astype(np.float32)),
                       pb_utils.Tensor("S2", np.array([[x[0] + b"!"] for x in s], dtype=object))]
            if self.kind == "GPU":
                import torch
                g = torch.from_numpy(np.ascontiguousarray(f)).cuda() * 3
                tensors.append(pb_utils.Tensor.from_dlpack("G3", g))
                info["torch"] = torch.__version__
            else:
                tensors.append(pb_utils.Tensor("G3", (f * 3).astype(np.float32)))
            tensors.append(pb_utils.Tensor("INFO", np.array([[json.dumps(info).encode()]] * len(f), dtype=object)))
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
'''


def _echo(url: str, model: str) -> dict:
    body = {"inputs": [{"name": "F", "shape": [2, 3], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6]},
                       {"name": "S", "shape": [2, 1], "datatype": "BYTES", "data": ["ab", "cd"]}]}
    req = urllib.request.Request(f"http://{url}/v2/models/{model}/infer", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            outputs = {o["name"]: o["data"] for o in json.loads(r.read())["outputs"]}
    except urllib.error.HTTPError as exc:
        return {"ok": False, "error": f"HTTP {exc.code}: {exc.read().decode(errors='replace')[:300]}"}
    except Exception as exc:  # noqa: BLE001 - a dead stub, a refused connection
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    expected = {"F2": [2, 4, 6, 8, 10, 12], "S2": ["ab!", "cd!"], "G3": [3, 6, 9, 12, 15, 18]}
    wrong = {k: outputs.get(k) for k, v in expected.items() if outputs.get(k) != v}
    info = json.loads(outputs["INFO"][0]) if outputs.get("INFO") else {}
    return {"ok": not wrong, "stub": info, **({"wrong": wrong} if wrong else {})}


def cmd_stub_check(args) -> int:
    from ..serve.options import ServerOptions
    from ..serve.server import TritonServer

    kinds = {"echo_cpu": "KIND_CPU"} if args.device == "cpu" else {"echo_cpu": "KIND_CPU", "echo_gpu": "KIND_GPU"}
    work = Path(tempfile.mkdtemp(prefix="bls-stub-check-"))
    report: dict = {"models": {}}
    server = None
    try:
        for name, kind in kinds.items():
            (work / "models" / name / "1").mkdir(parents=True)
            (work / "models" / name / "config.pbtxt").write_text(_ECHO_CONFIG.format(name=name, kind=kind))
            (work / "models" / name / "1" / "model.py").write_text(_ECHO_MODEL)
        server = TritonServer(ServerOptions.on_free_ports(work / "models", work / "tritonserver.log",
                                                          startup_timeout_s=120))
        try:
            server.start()
        except Exception as exc:  # noqa: BLE001 - the reason is the point of this step
            report["models"] = {name: {"ok": False, "error": "did not load"} for name in kinds}
            raise RuntimeError(f"the server did not start: {exc}") from None
        for name in kinds:
            report["models"][name] = _echo(server.http_url, name)
    except Exception as exc:  # noqa: BLE001
        report["error"] = str(exc)
    finally:
        if server is not None:
            server.stop()
        report["ok"] = "error" not in report and all(m.get("ok") for m in report["models"].values())
        log = work / "tritonserver.log"
        if log.exists() and not report["ok"]:
            lines = log.read_text(errors="replace").splitlines()
            report["server_log_errors"] = [ln for ln in lines if ln.startswith(("E", "terminate", "  what()"))][-20:]
        shutil.rmtree(work, ignore_errors=True)
    if not report["ok"]:
        numpy_hint = ("; a stub that dies on its first string tensor is the numpy >= 2 symptom (pybind11 2.10): "
                      "check results.json env.numpy")
        report.setdefault("error", "a stub answered wrongly: " + json.dumps(report["models"]) + numpy_hint)
    record(args.out, "stub_check", report)
    if not report["ok"]:
        print(f"gpubench stub-check: FAILED: {report['error']}", file=sys.stderr)
        return 1
    stubs = ", ".join(f"{name}: {model['stub']}" for name, model in report["models"].items())
    print(f"gpubench stub-check: ok ({stubs})")
    return 0
