#!/usr/bin/env bash
# Container start: build the TensorRT plan for *this* GPU if it is missing (plans are
# tied to the GPU model and TensorRT version), then serve models/ with bls-serve.
set -euo pipefail
cd /opt/bls
for model in resnet50 efficientnet_lite0; do
  plan="models/${model}_trt/1/model.plan"
  if [ ! -f "$plan" ]; then
    echo "Building $plan for this GPU (first start only; mount a volume on models/${model}_trt/1 to keep it)..."
    if ! python -m engine_build trt --model "$model" --fp16 --max-batch "${TRT_MAX_BATCH:-32}"; then
      echo "WARNING: TensorRT build of $plan FAILED: classify_bls will use the next candidate (resnet50_torch on the GPU, or ${model}_onnx on CPU; ROUTE says which)." >&2
    fi
  fi
done
# resnet50_torch needs no build here: its state dict comes with the image (Dockerfile).
exec bls-serve --host "${BLS_HOST:-0.0.0.0}" --model-repository models "$@"
