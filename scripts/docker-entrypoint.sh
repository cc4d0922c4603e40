#!/usr/bin/env bash
# Container start: build the TensorRT plan for *this* GPU if it is missing (plans are
# tied to the GPU model and TensorRT version), then serve models/ with bls-serve.
set -euo pipefail
cd /opt/bls
# Serving from S3 (deploy/k8s passes --model-repository s3://...): the plans in the bucket
# are what Triton loads, so none is built here.
case " $* " in
  *" s3://"*) models_to_build="" ;;
  *) models_to_build="resnet50 efficientnet_lite0" ;;
esac
for model in $models_to_build; do
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
