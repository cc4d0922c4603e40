"""Image classification on Triton Inference Server, with the pipeline written as code (BLS).

Users write flows against `bls_pipeline.flow`; the layers below run them, each importing
only the ones under it:

    base/      what every layer shares about Triton models: config.pbtxt, data types, tensors
    stages/    pure: encoded bytes -> pixels (decode, preprocess, batching), logits -> labels
    engines/   the child models' engines: onnxruntime, OpenVINO, torch, a numpy function
    runtime/   the flow runtime, pure over an injected child call: settings, child models,
               routing, the batch a flow sees; LocalFlow runs a flow in process
    adapter/   the Triton-facing glue that models/*/1/model.py hands over to (pb_utils, DLPack,
               async_exec, metrics)
    serve/     the local launcher (bls-serve), the model repository's plan, the client (bls-classify)
    tools/     bls-bench, bls-overhead, bls-trace, bls-demo
"""

__version__ = "0.2.0"
