# classify_bls on a GPU machine: NGC Triton (TensorRT + python backends).
#   docker build -t classify-bls .            (add --build-arg WEIGHTS=/opt/bls/my.pth for your own)
#   docker run --gpus all --shm-size 1g -p 8000:8000 -p 8001:8001 -p 8002:8002 -p 8003:8003 classify-bls
# The Triton image tag lives here and nowhere else: a current NGC release (26.10; Ubuntu
# 24.04 with Python 3.12, as every release since 25.01). The embedded Triton 2.51 (NGC
# 24.10) stays for local development only.
ARG TRITON_TAG=26.10
FROM nvcr.io/nvidia/tritonserver:${TRITON_TAG}-py3

# The TensorRT Python API must match the image's TensorRT: by default the version the
# image itself declares (NGC images set TRT_VERSION); --build-arg TENSORRT_VERSION=x.y.z overrides.
ARG TENSORRT_VERSION=""
# resnet50 weights for the ONNX export: imagenet (download at build time), or a .pth path.
ARG WEIGHTS=imagenet

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The image's own Python is this image's to install into (Ubuntu 24.04 marks it externally managed).
ENV PIP_BREAK_SYSTEM_PACKAGES=1
WORKDIR /opt/bls
COPY pyproject.toml README.md requirements.lock ./
COPY bls_pipeline bls_pipeline
COPY engine_build engine_build
# Every dependency at the version requirements.lock pins (the versions the tests passed
# with); tensorrt pinned to the image's own.
RUN trt="${TENSORRT_VERSION:-${TRT_VERSION:-}}"; trt="${trt%%+*}"; \
    if [ -z "$trt" ]; then echo "no TensorRT version: the image sets no TRT_VERSION; pass --build-arg TENSORRT_VERSION=x.y.z" >&2; exit 1; fi; \
    pip install --no-cache-dir --constraint requirements.lock ".[serve,gpu,build,s3]" "tensorrt==${trt}"
COPY models models
COPY samples samples
COPY scripts/docker-entrypoint.sh /usr/local/bin/bls-entrypoint
# The ONNX files and resnet50_torch's state dict (same weights as the ONNX) need no GPU:
# export them now (efficientnet_lite0's weights ship in a package). The TensorRT plans need
# the serving GPU: the entrypoint builds them at first start.
RUN python -m engine_build export --model efficientnet_lite0 \
 && python -m engine_build export --model resnet50 --weights "${WEIGHTS}" \
 && python -m engine_build torch --model resnet50 --weights "${WEIGHTS}"

# Run as a non-root user (uid 1000: Ubuntu's own "ubuntu" where the base image has it),
# owning /opt/bls so that the entrypoint can write the TensorRT plans into models/.
RUN id -u 1000 >/dev/null 2>&1 || useradd --uid 1000 --user-group --create-home bls; \
    chown -R 1000:1000 /opt/bls
USER 1000:1000

EXPOSE 8000 8001 8002 8003
ENTRYPOINT ["bls-entrypoint"]
