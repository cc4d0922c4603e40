#!/usr/bin/env bash
# Triton's own measuring tools at the served Triton's version (2.51), in .venv-perf/ from
# requirements-perf.lock: perf_analyzer (it ships in tritonclient 2.51.0's wheel) and Model
# Analyzer 1.58. Not in .venv: tritonclient 2.51 wants protobuf < 5, and the project pins
# tritonclient 2.73 with protobuf 6. perf_analyzer loads libcudart.so.12 at start even on a
# machine with no GPU (PyPI's nvidia-cuda-runtime-cu12, in the lock) and links libb64 (Debian's
# libb64-0d: installed with apt-get where missing, as .ci/run installs jq).
#   scripts/perf-tools.sh                      set up, once (a second run with the same lock does nothing)
#   scripts/perf-tools.sh perf_analyzer ARGS   run one of its tools (perf_analyzer, model-analyzer)
#                                              with the libraries it needs and its bin/ first on PATH
# Refresh the lock with scripts/lock.sh.
set -euo pipefail
root=$(cd -P "$(dirname "$0")/.." && pwd)
venv=$root/.venv-perf
lock=$root/requirements-perf.lock
PYTHON=${PYTHON:-python3}
want=$(sha256sum < "$lock" | cut -d' ' -f1)
if ! [ -x "$venv/bin/perf_analyzer" ] || [ "$(cat "$venv/.installed" 2>/dev/null)" != "$want" ]; then
  {
    echo "Installing perf_analyzer and Model Analyzer (requirements-perf.lock) into .venv-perf ..."
    [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet "$(grep '^pip==' "$lock")"
    "$venv/bin/python" -m pip install --quiet -r "$lock"
  } >&2
fi
cudart=$(echo "$venv"/lib/python3*/site-packages/nvidia/cuda_runtime/lib)
export LD_LIBRARY_PATH=$cudart${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
missing=$(ldd "$venv/bin/perf_analyzer" | sed -n 's/^\s*\(\S*\) => not found.*/\1/p')
if [ "$missing" = "libb64.so.0d" ]; then
  echo "perf_analyzer needs libb64.so.0d: installing Debian's libb64-0d with apt-get" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  { $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libb64-0d; } >&2
  missing=$(ldd "$venv/bin/perf_analyzer" | sed -n 's/^\s*\(\S*\) => not found.*/\1/p')
fi
if [ -n "$missing" ]; then
  echo "perf_analyzer cannot start: missing $(echo $missing)" >&2
  exit 1
fi
echo "$want" > "$venv/.installed"
[ $# -gt 0 ] || exit 0
tool=$1
shift
export PATH=$venv/bin:$PATH  # Model Analyzer runs perf_analyzer by name
exec "$venv/bin/$tool" "$@"
