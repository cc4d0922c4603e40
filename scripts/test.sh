#!/usr/bin/env bash
# Unit, integration (real tritonserver) and GPU tests (skipped with the reason here).
#   ./scripts/test.sh            everything (CI runs this), in BLS_TEST_WORKERS (default 2)
#                                pytest-xdist workers, each test file whole on one worker
#   ./scripts/test.sh --quick    the contributor's loop: the unit tests and one served smoke test
# Other arguments go to pytest (BLS_TEST_WORKERS=0: one process, unit tests first).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [ "${1:-}" = "--quick" ]; then
  shift
  export BLS_TEST_QUICK=1  # test_smoke.py serves a repository of its own, EfficientNet-Lite0 alone
  exec .venv/bin/python -m pytest tests/unit tests/integration/test_smoke.py "$@"
fi
workers=${BLS_TEST_WORKERS:-2}
if [ "$workers" = "0" ]; then
  exec .venv/bin/python -m pytest "$@"
fi
# Most tests wait on servers they start and stop; two workers keep both cores busy. The
# files go out in the order tests/conftest.py gives them (xdist would put the largest first).
exec .venv/bin/python -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
