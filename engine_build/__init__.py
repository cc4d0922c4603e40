"""Build the classifier artifacts that models/ serves: ONNX export, torch state dict, TensorRT plan,
CPU engines (INT8, OpenVINO IR).

    python -m engine_build export --weights random|imagenet|PATH.pth          (resnet50)
    python -m engine_build export --model efficientnet_lite0 [--weights random|PATH.pth]
    python -m engine_build torch --weights random|imagenet|PATH.pth           (resnet50_torch, same weights)
    python -m engine_build trt [--model efficientnet_lite0] [--fp16]
    python -m engine_build int8 [--model efficientnet_lite0] [--calibration DIR] [--method nncf|onnxruntime]
    python -m engine_build openvino [--model efficientnet_lite0]                (FP32 IR, needs openvino)
    python -m engine_build agreement --model efficientnet_lite0 [--engine int8|openvino]
    python -m engine_build accuracy --model efficientnet_lite0 --images DIR    (DIR/labels.csv: file,class_id)

The classifiers and their default paths are the table `export_onnx.EXPORTS`.
Artifacts are generated, never committed (.gitignore).
"""
