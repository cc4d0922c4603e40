"""Build the classifier artifacts that models/ serves: ONNX export and TensorRT plan.

    python -m engine_build export --weights random|imagenet|PATH.pth
    python -m engine_build trt [--fp16]

Artifacts are generated, never committed (.gitignore).
"""
