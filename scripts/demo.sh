#!/usr/bin/env bash
# The main job: set up, export the ONNX classifier if missing, start the embedded
# tritonserver, classify samples/ over HTTP and gRPC, print labels, stop.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/bls-demo "$@"
