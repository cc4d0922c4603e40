"""The engines of child models: what runs a model's own work, under the adapter's thin glue
inside Triton, in a flow's own process (run_in_process), and in LocalFlow.

    onnx.py               onnxruntime (an ONNX file) and OpenVINO (an IR): models/*_onnx, *_int8, *_openvino
    artifact_io.py        an engine file's tensors against its config.pbtxt; the weights it was exported with
    standby.py            an engine held only while calls come (a standby model)
    functions.py          a python child whose work is one numpy function (image_quality)
    torch_classifier.py   a torchvision classifier run by torch (models/*_torch)
"""
