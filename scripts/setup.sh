#!/usr/bin/env bash
# Create .venv and install the project with everything it needs (idempotent: a second
# run with the same pyproject.toml does nothing). Needs Python >= 3.9 with venv and pip.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
stamp=.venv/.installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
echo "Installing bls-pipeline and its dependencies into .venv (first run: torch + CUDA wheels, ~5 GB)..."
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --progress-bar on -e '.[all]' | grep -v '^Requirement already satisfied' || true
.venv/bin/python -c "import bls_pipeline, onnxruntime, torch, torchvision, tritonclient.grpc, pytriton" \
  || { echo "setup failed: the imports above did not work" >&2; exit 1; }
echo "$want" > "$stamp"
