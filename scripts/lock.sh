#!/usr/bin/env bash
# Refresh requirements.lock: install the project's dependencies afresh (newest releases that
# pyproject.toml allows) into a throwaway venv and freeze them. Then run ./scripts/test.sh
# (setup.sh reinstalls from the new lock) and commit the lock only if the tests pass.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PYTHON" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install --quiet --upgrade pip setuptools
"$tmp/venv/bin/python" -m pip install --progress-bar on '.[all]'
{
  echo "# Exact versions the tests passed with (scripts/setup.sh installs these). Refresh: scripts/lock.sh"
  "$tmp/venv/bin/python" -m pip freeze --all --exclude-editable | grep -v -E '^wheel==|^bls-pipeline'
} > requirements.lock
echo "wrote requirements.lock ($(grep -c '==' requirements.lock) pins); now run ./scripts/test.sh"
