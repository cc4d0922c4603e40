#!/usr/bin/env bash
# Create .venv with the exact versions in requirements.lock and the project (editable), once:
# a second run with the same pyproject.toml and lock does nothing. Needs Python >= 3.9 with
# venv and pip. Refresh the lock with scripts/lock.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
stamp=.venv/.installed
want=$(cat pyproject.toml requirements.lock | sha256sum | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
echo "Installing the pinned dependencies (requirements.lock) into .venv (first run: torch + CUDA wheels, ~5 GB)..."
.venv/bin/python -m pip install --quiet "$(grep '^pip==' requirements.lock)"
.venv/bin/python -m pip install --progress-bar on -r requirements.lock | grep -v '^Requirement already satisfied' || true
# The project itself, editable, built with the pinned setuptools (no download). setuptools
# prints a notice about editable installs as a UserWarning: not ours, not useful here.
PYTHONWARNINGS=ignore::UserWarning .venv/bin/python -m pip install --quiet --no-deps --no-build-isolation -e .
.venv/bin/python -c "import bls_pipeline.flow, onnxruntime, torch, torchvision, tritonclient.grpc, pytriton" \
  || { echo "setup failed: the imports above did not work" >&2; exit 1; }
echo "$want" > "$stamp"
