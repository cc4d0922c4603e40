#!/usr/bin/env bash
# Refresh requirements.lock: install the project's dependencies afresh (newest releases that
# pyproject.toml allows) into a throwaway venv and freeze them. Then run ./scripts/test.sh
# (setup.sh reinstalls from the new lock) and commit the lock only if the tests pass.
#   scripts/lock.sh perf   refresh requirements-perf.lock instead: Triton's measuring tools at
#                          the served Triton's version (scripts/perf-tools.sh installs it)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PYTHON" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install --quiet --upgrade pip setuptools
if [ "${1:-}" = "perf" ]; then
  # tritonclient 2.51.0: the wheel whose perf_analyzer matches the embedded Triton 2.51;
  # nvidia-cuda-runtime-cu12: the libcudart.so.12 it loads at start.
  "$tmp/venv/bin/python" -m pip install --progress-bar on 'tritonclient[all]==2.51.0' 'triton-model-analyzer==1.58.0' \
    'nvidia-cuda-runtime-cu12>=12,<13'
  {
    echo "# Triton's measuring tools (scripts/perf-tools.sh installs these into .venv-perf). Refresh: scripts/lock.sh perf"
    "$tmp/venv/bin/python" -m pip freeze --all | grep -v -E '^wheel=='
  } > requirements-perf.lock
  echo "wrote requirements-perf.lock ($(grep -c '==' requirements-perf.lock) pins); now run ./scripts/test.sh"
  exit 0
fi
"$tmp/venv/bin/python" -m pip install --progress-bar on '.[all]'
{
  echo "# Exact versions the tests passed with (scripts/setup.sh installs these). Refresh: scripts/lock.sh"
  "$tmp/venv/bin/python" -m pip freeze --all --exclude-editable | grep -v -E '^wheel==|^bls-pipeline'
} > requirements.lock
echo "wrote requirements.lock ($(grep -c '==' requirements.lock) pins); now run ./scripts/test.sh"
