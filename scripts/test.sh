#!/usr/bin/env bash
# Unit, integration (real tritonserver) and GPU tests (skipped with the reason here).
#   ./scripts/test.sh            everything (CI runs this)
#   ./scripts/test.sh --quick    the contributor's loop: the unit tests and one served smoke test
# Other arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [ "${1:-}" = "--quick" ]; then
  shift
  export BLS_TEST_QUICK=1  # test_smoke.py serves a repository of its own, EfficientNet-Lite0 alone
  exec .venv/bin/python -m pytest tests/unit tests/integration/test_smoke.py "$@"
fi
exec .venv/bin/python -m pytest "$@"
