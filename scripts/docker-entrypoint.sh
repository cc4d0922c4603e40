#!/usr/bin/env bash
# Container start: build the TensorRT plan for *this* GPU if it is missing (plans are
# tied to the GPU model and TensorRT version), then serve models/ with bls-serve.
set -euo pipefail
cd /opt/bls
if [ ! -f models/resnet50_trt/1/model.plan ]; then
  echo "Building models/resnet50_trt/1/model.plan for this GPU (first start only; mount a volume on models/resnet50_trt/1 to keep it)..."
  if ! python -m engine_build trt --fp16 --max-batch "${TRT_MAX_BATCH:-32}"; then
    echo "WARNING: TensorRT plan build FAILED: classify_bls will answer with resnet50_onnx on CPU (ROUTE says so)." >&2
  fi
fi
exec bls-serve --host "${BLS_HOST:-0.0.0.0}" --model-repository models "$@"
