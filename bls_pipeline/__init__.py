"""Image classification on Triton Inference Server, with the pipeline written as code (BLS).

Users write flows (bls_pipeline.flow); the rest of the package runs them:
    decode, preprocess, postprocess, batching   pure stages: bytes -> pixels, logits -> labels
    runtime/                                    the flow runtime, pure, over an injected model call
    adapter/                                    the Triton-facing glue that models/*/1/model.py hands over to
    server, repository, watchdog, client        the local launcher (bls-serve) and client (bls-classify)
    bench, overhead, stagetrace, demo           tools (bls-bench, bls-overhead, bls-trace, bls-demo)
"""

__version__ = "0.2.0"
