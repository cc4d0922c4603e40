# classify_bls on a GPU machine: NGC Triton (TensorRT + python backends).
#   docker build -t classify-bls .            (add --build-arg WEIGHTS=/opt/bls/my.pth for your own)
#   docker run --gpus all --shm-size 1g -p 8000:8000 -p 8001:8001 -p 8002:8002 classify-bls
# The Triton image tag lives here and nowhere else.
ARG TRITON_TAG=24.10
FROM nvcr.io/nvidia/tritonserver:${TRITON_TAG}-py3

# TensorRT Python API matching the image's TensorRT (24.10 ships TensorRT 10.5).
ARG TENSORRT_VERSION=10.5.0
# resnet50 weights for the ONNX export: imagenet (download at build time), or a .pth path.
ARG WEIGHTS=imagenet

WORKDIR /opt/bls
COPY pyproject.toml README.md ./
COPY bls_pipeline bls_pipeline
COPY engine_build engine_build
RUN pip install --no-cache-dir ".[serve,gpu,build]" "tensorrt==${TENSORRT_VERSION}"
COPY models models
COPY samples samples
COPY scripts/docker-entrypoint.sh /usr/local/bin/bls-entrypoint
# The ONNX files and resnet50_torch's state dict (same weights as the ONNX) need no GPU:
# export them now (efficientnet_lite0's weights ship in a package). The TensorRT plans need
# the serving GPU: the entrypoint builds them at first start.
RUN python -m engine_build export --model efficientnet_lite0 \
 && python -m engine_build export --model resnet50 --weights "${WEIGHTS}" \
 && python -m engine_build torch --model resnet50 --weights "${WEIGHTS}"

EXPOSE 8000 8001 8002
ENTRYPOINT ["bls-entrypoint"]
