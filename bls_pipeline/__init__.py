"""Image classification on Triton with the pipeline written as Business Logic Scripting.

Pure stages (decode, preprocess, postprocess, routing, config) plus the glue that talks
to Triton (server launcher, client, model adapters in models/).
"""

from .config import PipelineConfig, parse_pipeline_config
from .decode import DecodePolicy, ImageError, decode
from .pipeline import ImageRequest, Pipeline, Prediction, RequestError
from .preprocess import PreprocessSpec, preprocess_into

__all__ = [
    "DecodePolicy",
    "ImageError",
    "ImageRequest",
    "Pipeline",
    "PipelineConfig",
    "Prediction",
    "PreprocessSpec",
    "RequestError",
    "decode",
    "parse_pipeline_config",
    "preprocess_into",
]
