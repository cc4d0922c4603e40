#!/usr/bin/env bash
# Unit, integration (real tritonserver) and GPU tests (skipped with the reason here).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
