"""bls-pack-env's edits, without installing anything: the config parameter it writes, what
it refuses, and the settings parser that lets the backend's own parameter through."""

from __future__ import annotations

import shutil

import pytest

from bls_pipeline.runtime.settings import ConfigError, parse_settings
from bls_pipeline.tools.pack_env import PackError, _point_config_at, pack


def test_the_flow_settings_leave_the_backends_parameter_to_the_backend():
    parse_settings({"EXECUTION_ENV_PATH": "$$TRITON_MODEL_DIRECTORY/env.tar.gz", "default_topk": "3"}, None, "m")
    with pytest.raises(ConfigError, match="unknown parameter.*EXECUTION_ENV_PATh"):
        parse_settings({"EXECUTION_ENV_PATh": "x"}, None, "m")


def test_the_config_names_the_environment_once(tmp_path, repo_root):
    config = tmp_path / "config.pbtxt"
    shutil.copy(repo_root / "models" / "classify_bls" / "config.pbtxt", config)
    _point_config_at(config, "$$TRITON_MODEL_DIRECTORY/bls-env-py3.12.tar.gz")
    assert config.read_text().endswith(
        'parameters { key: "EXECUTION_ENV_PATH", value: { string_value: "$$TRITON_MODEL_DIRECTORY/bls-env-py3.12.tar.gz" } }\n')
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
