#!/usr/bin/env bash
# Run HERE, with a package index: the wheels scripts/gpu/run.sh installs on a GPU machine
# that has Python 3.12, torch and torchvision but no index (docs/gpu.md), into .whl/ beside
# the code (gitignored; carried with the checkout, under 64 MiB in all).
#
#   nvidia-pytriton   tritonserver + the python backend; trimmed to the Python 3.12 stub
#                     (scripts/gpu/wheels.py trim): 55 MB -> 27 MB
#   numpy 1.26        the stub (pybind11 2.10) breaks on numpy 2: the machine's numpy 2 is shadowed
#   tritonclient      and what its gRPC client imports that such a machine may lack or have too
#                     old: grpcio, protobuf, python-rapidjson, ml_dtypes
#   onnxscript        torch's ONNX exporter (engine_build export), with onnx-ir
#   efficientnet-lite-pytorch   the efficientnet_lite0 architecture (random weights there)
#
# Versions: requirements.lock's. Usage: scripts/gpu/fetch_wheels.sh [DEST] (default .whl)
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${1:-.whl}
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
TARGET_PYTHON=3.12
PACKAGES=(nvidia-pytriton numpy tritonclient grpcio protobuf python-rapidjson ml_dtypes onnxscript onnx-ir efficientnet-lite-pytorch)
LIMIT_BYTES=$((64 * 1024 * 1024))

pins=()
for name in "${PACKAGES[@]}"; do
  pin=$(grep -i -E "^${name//[-_]/[-_]}==" requirements.lock | head -1 || true)
  [ -n "$pin" ] || { echo "fetch_wheels: $name is not pinned in requirements.lock" >&2; exit 1; }
  pins+=("$pin")
done

download=$(mktemp -d)
trap 'rm -rf "$download"' EXIT
echo "Downloading ${pins[*]} for CPython $TARGET_PYTHON, x86_64 Linux..."
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$TARGET_PYTHON" --implementation cp \
  --platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$download" "${pins[@]}"

rm -rf "$DEST"
mkdir -p "$DEST"
echo "Trimming nvidia-pytriton to the Python $TARGET_PYTHON stub (about a minute: LZMA)..."
"$PY" scripts/gpu/wheels.py trim "$download"/nvidia_pytriton-*.whl --python "$TARGET_PYTHON" --out "$DEST"
for wheel in "$download"/*.whl; do
  case "$(basename "$wheel")" in nvidia_pytriton-*) ;; *) mv "$wheel" "$DEST/" ;; esac
done
(cd "$DEST" && sha256sum ./*.whl > MANIFEST)
total=$(du -cb "$DEST" | tail -1 | cut -f1)
ls -l "$DEST"
if [ "$total" -gt "$LIMIT_BYTES" ]; then
  echo "fetch_wheels: $DEST holds $total bytes, over the 64 MiB that can be carried" >&2
  exit 1
fi
echo "fetch_wheels: $DEST holds $((total / 1024 / 1024)) MiB in $(ls "$DEST"/*.whl | wc -l) wheels (limit 64 MiB)"
