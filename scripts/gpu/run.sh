#!/usr/bin/env bash
# The GPU path on a bare GPU machine, in one command (docs/gpu.md). Needs Python 3.12 with
# torch and torchvision (CUDA) and the wheels scripts/gpu/fetch_wheels.sh put in .whl/; no
# package index, no TensorRT, no Docker.
#
#   1 env      a venv over that Python's packages with the carried wheels first (numpy 1.26
#              shadows numpy 2) and this checkout on its path (the project, without deps)
#   2 checks   gpubench env, then stub-check: the python backend stub works with this numpy
#              (a failure skips step 6, the server benchmark; the rest still runs)
#   3 exports  random-weight resnet50 (ONNX + torch state dict) and efficientnet_lite0
#   4 tests    pytest tests/gpu, and tests/unit's GPU pixel, JPEG header and transport tests
#   5 decode   (a) decode + preprocess in process, GPU path vs CPU path; then resnet50_torch
#              in process, eager vs CUDA graphs
#   6 serve    (b) end to end over gRPC, concurrency 1..256
#
# Results in $OUT (default ./gpu_results): summary.md, results.json, run.log, tests_gpu.txt,
# tritonserver_bench.log. --skip tests,decode,classifier leaves those steps out; extra
# arguments after -- go to `gpubench serve` (e.g. -- --gpu-flow-instances 4 --concurrency
# 64,256). --cpu-check runs the same steps here without a GPU (the project's
# .venv as the base Python, no wheels installed, CPU instances, the torch path on the CPU);
# --quick shortens the measurements (what the test of this script runs).
# Exit status: 0 when every step passed, 1 otherwise (summary.md says which failed).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
MODE=gpu
QUICK=0
OUT=${OUT:-$ROOT/gpu_results}
WORK=${WORK:-$ROOT/.gpuwork}
BASE_PY=${BASE_PY:-}
BUDGET=${BUDGET:-560}  # seconds for the whole run: the device tool stops a command at 600
SKIP=,
SERVE_EXTRA=()
usage="usage: scripts/gpu/run.sh [--cpu-check] [--quick] [--skip STEP,...] [--out DIR] [--work DIR] [--python BASE_PYTHON] [-- SERVE_ARGS...]"
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-check) MODE=cpu ;;
    --quick) QUICK=1 ;;
    --skip) SKIP=",$2,"; shift ;;
    --) shift; SERVE_EXTRA=("$@"); break ;;
    --out) OUT=$2; shift ;;
    --work) WORK=$2; shift ;;
    --python) BASE_PY=$2; shift ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$BASE_PY" ]; then
  if [ "$MODE" = cpu ]; then BASE_PY=$ROOT/.venv/bin/python; else BASE_PY=/opt/torch/.venv/bin/python3; fi
fi
[ -x "$BASE_PY" ] || BASE_PY=$(command -v python3)
DEVICE=$([ "$MODE" = gpu ] && echo cuda || echo cpu)
mkdir -p "$OUT" "$WORK"
OUT=$(cd "$OUT" && pwd)
WORK=$(cd "$WORK" && pwd)
exec > >(tee -a "$OUT/run.log") 2>&1
START=$(date +%s)
FAILED=()
step() { echo; echo "== [$(( $(date +%s) - START ))s] $*"; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
finish() {
  step "done: ${#FAILED[@]} step(s) failed${FAILED[*]:+: ${FAILED[*]}}"
  [ -f "$OUT/summary.md" ] && cat "$OUT/summary.md"
  [ ${#FAILED[@]} -eq 0 ]
  exit $?
}

# ---- 1 env ----------------------------------------------------------------------------------
step "env: $MODE mode, base Python $BASE_PY, work in $WORK, results in $OUT"
ENV=$WORK/env
make_venv() {  # what `python -m venv --without-pip` makes, for a Python whose venv module is missing
  "$BASE_PY" - "$ENV" <<'PY'
import os, pathlib, sys
env, base = pathlib.Path(sys.argv[1]), os.path.realpath(getattr(sys, "_base_executable", sys.executable))
version = f"{sys.version_info.major}.{sys.version_info.minor}"
(env / "bin").mkdir(parents=True, exist_ok=True)
(env / "lib" / f"python{version}" / "site-packages").mkdir(parents=True, exist_ok=True)
(env / "pyvenv.cfg").write_text(f"home = {os.path.dirname(base)}\ninclude-system-site-packages = false\nversion = {sys.version.split()[0]}\n")
for name in ("python", "python3", f"python{version}"):
    if not (env / "bin" / name).exists():
        (env / "bin" / name).symlink_to(base)
PY
}
if [ ! -x "$ENV/bin/python" ]; then
  "$BASE_PY" -m venv --without-pip "$ENV" || make_venv || { echo "cannot create a venv from $BASE_PY"; FAILED+=(env); finish; }
fi
PY=$ENV/bin/python
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
BASE_SITE=$("$BASE_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# .pth files run in name order: this checkout, then the base Python's packages (their own
# .pth files too), both after the venv's own site-packages, where the carried wheels go.
echo "$ROOT" > "$SITE/bls_checkout.pth"
echo "import site; site.addsitedir('$BASE_SITE')" > "$SITE/zz_base_packages.pth"
if [ "$MODE" = gpu ]; then
  wheels=("$ROOT"/.whl/*.whl)
  [ -e "${wheels[0]}" ] || { echo "no wheels in $ROOT/.whl: run scripts/gpu/fetch_wheels.sh where there is an index, and carry .whl"; FAILED+=(env); finish; }
  stamp=$(cat "$ROOT/.whl/MANIFEST" 2>/dev/null | sha256sum | cut -c1-16)
  if [ "$(cat "$ENV/.installed" 2>/dev/null)" != "$stamp" ]; then
    if "$PY" -c "import pip" 2>/dev/null; then
      "$PY" -m pip install --quiet --no-index --no-deps --ignore-installed --no-compile --disable-pip-version-check "${wheels[@]}"
    else
      "$PY" scripts/gpu/wheels.py install "${wheels[@]}" --site "$SITE"
    fi && echo "$stamp" > "$ENV/.installed" || { echo "installing the carried wheels failed"; FAILED+=(env); finish; }
  fi
else
  echo "cpu-check: the carried wheels are for Python 3.12 and are not installed here; the base Python has the project's dependencies"
fi
"$PY" -c "import numpy, bls_pipeline, sys; print('python', sys.version.split()[0], 'numpy', numpy.__version__, 'bls_pipeline from', bls_pipeline.__file__)"

# ---- 2 checks -------------------------------------------------------------------------------
# A failed check skips the server benchmark only: the in-process steps still tell something.
step "checks: the machine, then the python backend stub"
SERVER_OK=1
"$PY" -m bls_pipeline.tools.gpubench env --device "$DEVICE" --out "$OUT" || { FAILED+=(env-check); SERVER_OK=0; }
if [ $SERVER_OK = 1 ]; then
  "$PY" -m bls_pipeline.tools.gpubench stub-check --device "$DEVICE" --out "$OUT" || { FAILED+=(stub-check); SERVER_OK=0; }
fi

# ---- 3 exports ------------------------------------------------------------------------------
step "exports: random-weight resnet50 (ONNX, torch) and efficientnet_lite0 into $WORK/models"
MODELS=$WORK/models
# The configs as checked out (no artifact of the checkout's); what an earlier run exported stays.
"$PY" -c "import shutil, sys; shutil.copytree(sys.argv[1], sys.argv[2], symlinks=True, dirs_exist_ok=True,
  ignore=shutil.ignore_patterns('*.onnx', '*.onnx.data', '*.onnx.json', '*.pt', '*.pt.json', '*.plan', '__pycache__'))" "$ROOT/models" "$MODELS"
export_failed=""
export_one() {  # artifact, weights kept, command...: export unless the artifact is there with those weights
  local artifact=$1 kept=$2; shift 2
  if [ -f "$artifact" ] && grep -qE "\"weights\": \"($kept)\"" "$artifact.json" 2>/dev/null; then echo "have $artifact"; return 0; fi
  "$PY" -m engine_build "$@" || export_failed="$export_failed ${artifact#$MODELS/}"
}
# resnet50's ONNX and torch exports are checked against each other: both the seeded random
# weights. efficientnet_lite0's speed does not depend on its weights: an export of either is kept.
export_one "$MODELS/resnet50_onnx/1/model.onnx" random export --model resnet50 --weights random \
  --output "$MODELS/resnet50_onnx/1/model.onnx"
export_one "$MODELS/resnet50_torch/1/model.pt" random torch --model resnet50 --weights random \
  --output "$MODELS/resnet50_torch/1/model.pt" --onnx "$MODELS/resnet50_onnx/1/model.onnx"
export_one "$MODELS/efficientnet_lite0_onnx/1/model.onnx" "random|pretrained" export --model efficientnet_lite0 --weights random \
  --output "$MODELS/efficientnet_lite0_onnx/1/model.onnx"
if [ -n "$export_failed" ]; then
  FAILED+=(exports)
  "$PY" -m bls_pipeline.tools.gpubench note --section exports --status failed --detail "failed:$export_failed" --out "$OUT"
else
  "$PY" -m bls_pipeline.tools.gpubench note --section exports --detail "random weights in $MODELS" --out "$OUT"
fi

# ---- 4 tests --------------------------------------------------------------------------------
skipped() { case "$SKIP" in *",$1,"*) echo "skipped: --skip $1"; return 0 ;; esac; return 1; }
step "tests: pytest tests/gpu ($([ "$MODE" = gpu ] && echo "on the GPU" || echo "they skip without one, with the reason"))"
if ! skipped tests; then
  # tests/gpu, then the pixel, header and transport tests of tests/unit, whose CUDA cases run here.
  BLS_TEST_MODELS=$MODELS timeout $(( $(left) > 240 ? 240 : ($(left) > 60 ? $(left) - 30 : 30) )) \
    "$PY" -m pytest tests/gpu -m gpu -q -rA -p no:cacheprovider > "$OUT/tests_gpu.txt" 2>&1
  tests_rc=$?
  timeout 120 "$PY" -m pytest tests/unit/test_gpu_pixels.py tests/unit/test_jpeg_header.py tests/unit/test_gpu_transport.py \
    -q -rA -p no:cacheprovider >> "$OUT/tests_gpu.txt" 2>&1 || tests_rc=$((tests_rc ? tests_rc : 1))
  tail -5 "$OUT/tests_gpu.txt"
  if [ $tests_rc -eq 0 ]; then
    "$PY" -m bls_pipeline.tools.gpubench note --section tests --log "$OUT/tests_gpu.txt" --out "$OUT"
  else
    FAILED+=(tests)
    "$PY" -m bls_pipeline.tools.gpubench note --section tests --status failed --detail "pytest exit $tests_rc (tests_gpu.txt)" \
      --log "$OUT/tests_gpu.txt" --out "$OUT"
  fi
fi

# ---- 5 decode -------------------------------------------------------------------------------
step "decode: (a) in process, GPU path vs CPU path"
if ! skipped decode; then
  if [ $QUICK = 1 ]; then decode_args=(--batch 16 --seconds 0.5 --min-runs 1); else decode_args=(--batch 64,256 --seconds 2); fi
  "$PY" -m bls_pipeline.tools.gpubench decode --device "$DEVICE" --out "$OUT" "${decode_args[@]}" || FAILED+=(decode)
fi

step "classifier: resnet50_torch in process, eager vs CUDA graphs"
if ! skipped classifier; then
  if [ $QUICK = 1 ]; then classifier_args=(--classifier-batch 1,2 --seconds 0.5 --min-runs 1); else classifier_args=(--seconds 2); fi
  "$PY" -m bls_pipeline.tools.gpubench classifier --device "$DEVICE" --out "$OUT" --model-repository "$MODELS" \
    "${classifier_args[@]}" || FAILED+=(classifier)
fi

# ---- 6 serve --------------------------------------------------------------------------------
step "serve: (b) end to end over gRPC ($(left) s left)"
if [ $SERVER_OK = 0 ]; then
  echo "skipped: the checks above failed (results.json says why)"
  FAILED+=(serve)
  finish
fi
if [ $QUICK = 1 ]; then
  serve_args=(--concurrency 2 --duration 2 --warmup 1 --client-procs 2)  # one point per target; resnet50 fp32 on 2 busy cores: ~0.1-1 s a request
else
  serve_args=(--concurrency 1,2,4,8,16,32,64,128,256 --duration 4 --warmup 1.5 --client-procs 6)
fi
"$PY" -m bls_pipeline.tools.gpubench serve --device "$DEVICE" --out "$OUT" --model-repository "$MODELS" \
  --time-budget $(( $(left) - 20 )) "${serve_args[@]}" "${SERVE_EXTRA[@]}" || FAILED+=(serve)
finish
