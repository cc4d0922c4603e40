"""bls-tritonserver names a --load-model that cannot load before it execs tritonserver (which
would exit 1, and Model Analyzer say only "Connection refused"): the INT8 engine not built,
a folder that is not there. No server here: the repository is a copy of the shipped folders."""

from __future__ import annotations

import shutil

from bls_pipeline.serve.tritonserver import load_problems


def test_a_load_model_not_built_or_not_there_is_named_with_its_cause(repo_root, tmp_path):
    repo = tmp_path / "models"
    for name in ("efficientnet_lite0_int8", "image_quality"):
        shutil.copytree(repo_root / "models" / name, repo / name,
                        ignore=shutil.ignore_patterns("*.onnx*", "__pycache__"))
    backends = tmp_path / "backends"
    (backends / "python").mkdir(parents=True)
    command = ["tritonserver", f"--backend-directory={backends}"]
    args = [f"--model-repository={repo}", "--model-control-mode=explicit", "--load-model=efficientnet_lite0_int8",
            "--load-model", "image_quality", "--load-model=nope"]
    problems = load_problems(args, command)
    assert set(problems) == {"efficientnet_lite0_int8", "nope"}  # image_quality (numpy) loads
    assert "efficientnet_lite0_int8/1/model.onnx is missing" in problems["efficientnet_lite0_int8"]
    assert "-m engine_build int8" in problems["efficientnet_lite0_int8"]
    assert problems["nope"] == f"no folder nope in the model repository {repo}"


def test_what_it_cannot_check_is_left_to_tritonserver(tmp_path):
    assert load_problems(["--model-repository=s3://bucket/models", "--load-model=m"], ["tritonserver"]) == {}
    assert load_problems([f"--model-repository={tmp_path}", "--load-model=*"], ["tritonserver"]) == {}
    assert load_problems([f"--model-repository={tmp_path}"], ["tritonserver"]) == {}
