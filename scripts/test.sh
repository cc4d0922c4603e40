#!/usr/bin/env bash
# Unit, integration (real tritonserver) and GPU tests (skipped with the reason here).
#   ./scripts/test.sh            everything but the timing tier (CI runs this), in
#                                BLS_TEST_WORKERS (default 3) pytest-xdist workers, each test
#                                file whole on one worker
#   ./scripts/test.sh --quick    the contributor's loop: the unit tests and one served smoke test
#   ./scripts/test.sh --timing   the timing tier (tests marked `timing`: stop and recovery times,
#                                soak growth, alerts while an overload lasts, a busy machine made
#                                on purpose), one at a time, each printing its figures: run it
#                                on a quiet machine
# Other arguments go to pytest (BLS_TEST_WORKERS=0: one process, unit tests first).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Python's bytecode cache on (gitignored __pycache__/), even where the environment turns it
# off: the run starts hundreds of Python processes (stubs, command lines) that import this
# checkout's modules, and each would compile them anew.
unset PYTHONDONTWRITEBYTECODE
if [ "${1:-}" = "--timing" ]; then
  shift
  exec .venv/bin/python -m pytest -m timing -s "$@"
fi
if [ "${1:-}" = "--quick" ]; then
  shift
  export BLS_TEST_QUICK=1  # test_smoke.py serves a repository of its own, EfficientNet-Lite0 alone
  exec .venv/bin/python -m pytest tests/unit tests/integration/test_smoke.py "$@"
fi
# perf_analyzer (tests/integration/test_perf_analyzer.py), in its own environment, .venv-perf.
scripts/perf-tools.sh
workers=${BLS_TEST_WORKERS:-3}
if [ "$workers" = "0" ]; then
  exec .venv/bin/python -m pytest "$@"
fi
# Most tests wait on servers they start, load and stop: on two cores, a third worker uses
# the time those waits leave. The files go out in the order tests/conftest.py gives them
# (xdist would put the largest first).
# torch runs one thread per process: with every core busy, its OpenMP threads wait on each
# other (resnet50 on the CPU: 3 images/s on two threads beside one busy core, 6 on one).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec .venv/bin/python -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
