"""bls-pack-env without installing anything: the config parameter it writes, what it refuses,
the settings parser that lets the backend's own parameter through, and the standard library
an environment for this Python gives the stub."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from bls_pipeline.base.errors import ConfigError
from bls_pipeline.runtime.load.settings import parse_settings
from bls_pipeline.tools.pack_env import PackError, _point_config_at, _venv_layout, main, pack, this_python


def test_the_flow_settings_leave_the_backends_parameter_to_the_backend():
    parse_settings({"EXECUTION_ENV_PATH": "$$TRITON_MODEL_DIRECTORY/env.tar.gz", "default_topk": "3"}, None, "m")
    with pytest.raises(ConfigError, match="unknown parameter.*EXECUTION_ENV_PATh"):
        parse_settings({"EXECUTION_ENV_PATh": "x"}, None, "m")


def test_the_config_names_the_environment_once(tmp_path, repo_root):
    config = tmp_path / "config.pbtxt"
    shutil.copy(repo_root / "models" / "classify_bls" / "config.pbtxt", config)
    _point_config_at(config, "$$TRITON_MODEL_DIRECTORY/bls-env-py3.12.tar.gz")
    assert config.read_text().endswith(
        'parameters { key: "EXECUTION_ENV_PATH", value: { string_value: '
        '"$$TRITON_MODEL_DIRECTORY/bls-env-py3.12.tar.gz" } }\n')
    with pytest.raises(PackError, match="already sets EXECUTION_ENV_PATH"):
        _point_config_at(config, "$$TRITON_MODEL_DIRECTORY/other.tar.gz")


def test_pack_refuses_before_it_installs(tmp_path, repo_root):
    with pytest.raises(PackError, match="exists: give a new folder"):
        pack(repo_root / "models", tmp_path)
    with pytest.raises(PackError, match="write the target's major.minor"):
        pack(repo_root / "models", tmp_path / "out", python_version="3")
    with pytest.raises(PackError, match="not python models of .*: ensemble_resnet50"):
        pack(repo_root / "models", tmp_path / "out", models=("ensemble_resnet50",))
    assert not (tmp_path / "out").exists()


def test_this_pythons_environment_gives_the_stub_this_pythons_standard_library(tmp_path):
    """The stub embeds this Python's libpython and takes its prefix from the first `python3` on
    PATH, the environment's after bin/activate: this Python's executable started as `python3`
    with only the environment's bin on PATH finds it the same way. Its standard library must
    be this build's, whole (a module another build compiles in, `_struct`, imported from it)."""
    version, home = this_python()
    site = _venv_layout(tmp_path / "env", version, home)
    probe = "import _struct, json, sys; print(json.dumps([sys.base_prefix, sys.path]))"
    proc = subprocess.run(["python3", "-I", "-c", probe], executable=os.path.realpath(sys._base_executable),
                          env={"PATH": str(tmp_path / "env" / "bin")}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    base_prefix, path = json.loads(proc.stdout)
    assert base_prefix == sys.base_prefix
    assert str(site) in path


def test_this_python_is_given_alone(tmp_path, repo_root, capsys):
    assert main([str(repo_root / "models"), str(tmp_path / "out"), "--this-python", "--python-version", "3.12"]) == 2
    assert "give it or --python-version and --python-home, not both" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
