"""The pieces of the one-command GPU run that need no server: the scripts parse, the wheels
they fetch are the pinned ones, the wheel trimming and unpacking, gpubench's repository
variants, ratios and summary. tests/gpu/test_run_script.py runs the whole script here."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2

from bls_pipeline.base.modelconfig import parse_config, string_parameters
from bls_pipeline.tools import gpubench, gpubench_results, gpubench_serve

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts" / "gpu"
sys.path.insert(0, str(SCRIPTS))
import wheels  # noqa: E402  (scripts/gpu/wheels.py)


@pytest.mark.parametrize("script", ["run.sh", "fetch_wheels.sh"])
def test_the_scripts_parse(script):
    assert subprocess.run(["bash", "-n", str(SCRIPTS / script)], capture_output=True).returncode == 0


def test_the_scripts_onnx_exports_are_random_weight_exports_of_both_models(monkeypatch, tmp_path):
    """tests/gpu/test_run_script.py hands the script both ONNX exports, so it runs neither
    of these commands: they go through engine_build's command line here, the export recorded."""
    from engine_build import cli, export_onnx

    script = (SCRIPTS / "run.sh").read_text().replace("\\\n", " ")
    lines = re.findall(r'^export_one "\$MODELS/\S+" \S+ (export .*)$', script, re.M)
    exported = []
    monkeypatch.setattr(export_onnx, "build_torch_model", lambda weights, model: (model, weights))
    monkeypatch.setattr(export_onnx, "export_onnx",
                        lambda model, output, weights: exported.append((*model, output)) or 0.0)
    for line in lines:
        assert cli.main(line.replace("$MODELS", str(tmp_path)).replace('"', "").split()) == 0
    assert exported == [("resnet50", "random", tmp_path / "resnet50_onnx/1/model.onnx"),
                        ("efficientnet_lite0", "random", tmp_path / "efficientnet_lite0_onnx/1/model.onnx")]


def test_fetch_wheels_downloads_pinned_versions():
    packages = re.search(r"^PACKAGES=\((.*)\)$", (SCRIPTS / "fetch_wheels.sh").read_text(), re.M).group(1).split()
    lock = (ROOT / "requirements.lock").read_text().lower().replace("_", "-")
    for name in packages:
        assert re.search(rf"^{re.escape(name.lower().replace('_', '-'))}==", lock, re.M), f"{name} is not pinned"
    assert "nvidia-pytriton" in packages and "numpy" in packages and "tritonclient" in packages
    assert re.search(r"^numpy==1\.", lock, re.M), "the stub needs numpy < 2"


def _wheel(path: Path, files: dict[str, tuple[bytes, int]]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, (data, mode) in files.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            z.writestr(info, data)
    return path


def test_a_wheel_unpacks_without_pip(tmp_path):
    wheel = _wheel(tmp_path / "demo-1.0-py3-none-any.whl", {
        "demo/__init__.py": (b"VALUE = 3\n", 0o644),
        "demo/bin/tool": (b"#!/bin/sh\necho hi\n", 0o755),
        "demo-1.0.data/purelib/demo_extra.py": (b"X = 1\n", 0o644),
        "demo-1.0.data/scripts/cli": (b"#!/bin/sh\n", 0o755),
        "demo-1.0.dist-info/RECORD": (b"", 0o644),
    })
    site = tmp_path / "site"
    wheels.install([wheel], site)
    assert (site / "demo" / "__init__.py").read_text() == "VALUE = 3\n" and (site / "demo_extra.py").exists()
    assert (site / "demo" / "bin" / "tool").stat().st_mode & 0o111
    assert not (site / "cli").exists() and (site / "demo-1.0.dist-info" / "RECORD").exists()


@pytest.mark.skipif(shutil.which("readelf") is None or not Path("/bin/true").exists(),
                    reason="needs readelf and /bin/true")
def test_trimming_keeps_one_python_and_the_libraries_it_needs(tmp_path):
    elf = Path("/bin/true").read_bytes()  # an ELF that needs libc.so.6
    source = _wheel(tmp_path / "nvidia_pytriton-0.7.0-py3-none-manylinux_2_35_x86_64.whl", {
        "pytriton/tritonserver/bin/tritonserver": (elf, 0o755),
        "pytriton/tritonserver/python_backend_stubs/3.12/triton_python_backend_stub": (elf, 0o755),
        "pytriton/tritonserver/python_backend_stubs/3.13/triton_python_backend_stub": (elf, 0o755),
        "nvidia_pytriton.libs/libc.so.6": (b"needed by the kept binaries", 0o644),
        "nvidia_pytriton.libs/libpython3-abc.13.so.1.0": (b"needed by nothing kept", 0o644),
        "nvidia_pytriton-0.7.0.dist-info/RECORD": (b"pytriton/tritonserver/bin/tritonserver,sha256=x,1\n"
                                                   b"pytriton/tritonserver/python_backend_stubs/3.13/triton_python_backend_stub,sha256=y,1\n"
                                                   b"nvidia_pytriton-0.7.0.dist-info/RECORD,,\n", 0o644),
    })
    trimmed = wheels.trim(source, "3.12", tmp_path / "out")
    assert trimmed.name == "nvidia_pytriton-0.7.0-0trimmed-py3-none-manylinux_2_35_x86_64.whl"
    with zipfile.ZipFile(trimmed) as z:
        names = set(z.namelist())
        assert names == {"pytriton/tritonserver/bin/tritonserver",
                         "pytriton/tritonserver/python_backend_stubs/3.12/triton_python_backend_stub",
                         "nvidia_pytriton.libs/libc.so.6", "nvidia_pytriton-0.7.0.dist-info/RECORD"}
        assert all(i.compress_type == zipfile.ZIP_LZMA for i in z.infolist())
        assert (z.getinfo("pytriton/tritonserver/bin/tritonserver").external_attr >> 16) & 0o111
        assert "3.13" not in z.read("nvidia_pytriton-0.7.0.dist-info/RECORD").decode()


@pytest.mark.parametrize("gpu", [True, False])
def test_the_bench_repository_has_both_flows_and_the_ceiling(tmp_path, gpu):
    gpubench_serve.gpu_repository(ROOT / "models", tmp_path / "models", gpu)
    kinds = {}
    for name in (gpubench_results.GPU_FLOW, gpubench_results.CPU_FLOW, gpubench_results.CEILING):
        cfg = parse_config(tmp_path / "models" / name)
        assert cfg.name == name
        kinds[name] = {model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind) for g in cfg.instance_group}
    want_gpu = "KIND_GPU" if gpu else "KIND_CPU"
    assert (kinds
            == {gpubench_results.GPU_FLOW: {want_gpu}, gpubench_results.CPU_FLOW: {"KIND_CPU"},
                gpubench_results.CEILING: {want_gpu}})
    for flow in (gpubench_results.GPU_FLOW, gpubench_results.CPU_FLOW):
        params = string_parameters(parse_config(tmp_path / "models" / flow))
        assert {k: params[k] for k in gpubench_serve.FLOW_SETTINGS} == gpubench_serve.FLOW_SETTINGS
        assert (tmp_path / "models" / flow / "1" / "flow.py").exists()
    ceiling = parse_config(tmp_path / "models" / gpubench_results.CEILING)
    if gpu:  # the shipped config's batch: every bucket's CUDA graph
        assert ceiling.max_batch_size == parse_config(ROOT / "models" / gpubench_results.CEILING).max_batch_size == 64
    else:  # a dry run warms up to a batch that a CPU runs in well under a second
        assert (string_parameters(ceiling)["precision"] == "fp32"
                and ceiling.max_batch_size == gpubench_serve.DRY_RUN_MAX_BATCH)


def _point(target, c, ips, errors=0):
    return {"target": target, "concurrency": c, "images_per_s": ips, "p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 3.0,
            "requests": 100, "errors": errors, "server_queue_ms": 0.1, "server_compute_ms": 0.5,
            "escalated_fraction": None}


def test_the_ratios_and_the_summary_say_what_was_measured(tmp_path):
    points = [_point(gpubench_results.GPU_FLOW, 8, 800.0), _point(gpubench_results.GPU_FLOW, 16, 900.0, errors=2),
              _point(gpubench_results.CEILING, 8, 1000.0), _point(gpubench_results.CPU_FLOW, 8, 300.0)]
    decode = {"rows": [{"batch": 64, "gpu_path_images_per_s": 5000.0, "cpu_path_images_per_s": 400.0,
                        "gpu_over_cpu": 12.5}]}
    ratios = gpubench_serve.serve_ratios(points, decode)
    assert ratios["best"][gpubench_results.GPU_FLOW]["concurrency"] == 8  # a point with errors is no best
    assert ratios["gpu_flow_over_ceiling"] == pytest.approx(0.8)
    assert ratios["gpu_flow_over_cpu_flow"] == pytest.approx(800 / 300)
    assert ratios["predicted_gpu_flow_over_cpu_flow"] == pytest.approx(1000 / 400)
    gpubench_results.record(tmp_path, "decode",
                            {**decode, "images": "16 JPEGs", "spec": "imagenet", "gpu_path_device": "cuda:0",
                                         "cpu_threads": 16, "target_images_per_s": 15000})
    gpubench_results.record(tmp_path, "serve", {"points": points, "client_processes": 4, "duration_s": 4, "warmup_s": 1,
                                        "images": 16, "ratios": ratios,
                                        "gpu_memory_mib": {"after_load": {"resnet50_torch": 900}}})
    text = (tmp_path / "summary.md").read_text()
    assert "| 64 | 5000 | 400 | 12.50 |" in text and "gpu_flow_over_ceiling: 0.800 (target: >= 0.8)" in text
    assert "| classify_bls_gpu | 8 | 800.0 |" in text and '"resnet50_torch": 900' in text
    assert set(json.loads((tmp_path / "results.json").read_text())) == {"decode", "serve"}


def test_a_note_records_a_shell_steps_outcome(tmp_path):
    log = tmp_path / "tests.txt"
    log.write_text("....\n3 passed, 2 skipped in 4.1s\n")
    assert gpubench.main(["note", "--section", "tests", "--log", str(log), "--out", str(tmp_path)]) == 0
    assert (json.loads((tmp_path / "results.json").read_text())["tests"]
            == {"ok": True, "summary": "3 passed, 2 skipped in 4.1s"})
    assert "## tests/gpu: ok" in (tmp_path / "summary.md").read_text()
