"""read_text_handwritten: read_text's work, written the way hand-written BLS examples are
(python_backend's examples/bls): straight on triton_python_backend_utils, execute() loops
over its requests, and every line of text gets its own child requests.

    for each request:   text_detector on its images, ONE InferenceRequest
        for each line:  text_orientation, ONE InferenceRequest for this line
                        text_recognizer,  ONE InferenceRequest for this line (turned round if flipped)
        TEXT, REGION_COUNT per image

bls-bench serves it beside read_text, which sends the lines of every image of an execute()
in one batched call per model, to measure what that batching buys. Only the batching
differs: decoding, the detector's boxes, the crops, their preprocessing, the thresholds and
the answer are read_text's (the library's pure functions, read_text's config values).
"""

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from bls_pipeline.runtime.decode.boxes import found_boxes
from bls_pipeline.runtime.load.children import load_child
from bls_pipeline.stages.decode import DecodePolicy, ImageError, decode, decode_scale
from bls_pipeline.stages.preprocess import preprocess_into, preprocess_region

DETECTOR, ORIENTATION, RECOGNIZER = "text_detector", "text_orientation", "text_recognizer"
FLIPPED = 1  # text_orientation's class "180"


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        self.min_height = float(params["min_height"])
        self.min_box_score = float(params["min_box_score"])
        self.flip_threshold = float(params["flip_threshold"])
        self.min_confidence = float(params["min_confidence"])
        self.policy = DecodePolicy(draft_min_side=int(params["draft_min_side"]))
        repo = Path(args["model_repository"]).parent
        self.detector = load_child(repo, DETECTOR)
        self.orientation = load_child(repo, ORIENTATION)
        self.recognizer = load_child(repo, RECOGNIZER)

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                text, count = self._read(pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()[:, 0])
            except (ImageError, pb_utils.TritonModelException) as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("TEXT", np.array(text, dtype=object).reshape(-1, 1)),
                pb_utils.Tensor("REGION_COUNT", np.array(count, dtype=np.int32).reshape(-1, 1))]))
        return responses

    def _read(self, encoded):
        images = [decode(bytes(data), self.policy) for data in encoded]
        spec = self.detector.preprocess
        pixels = np.empty((len(images), *spec.input_shape), spec.numpy_dtype)
        for image, row in zip(images, pixels):
            preprocess_into(image, spec, row)
        det = self.detector.detector
        names = [name for name in (det.boxes, det.scores, det.count) if name is not None]
        values = _infer(DETECTOR, {self.detector.image.name: pixels}, names)
        sources = np.array([(0, 0, image.width, image.height) for image in images], dtype=np.float64)
        scales = np.array([decode_scale(image) for image in images])
        found = found_boxes(self.detector, values, np.arange(len(images)), sources, scales)
        texts, counts = [], []
        for i, image in enumerate(images):
            mine = found.source == i
            lines = [self._line(image, box, score, scales[i])
                     for box, score in zip(found.boxes[mine], found.scores[mine])]
            texts.append(b"\n".join(text for text in lines if text is not None))
            counts.append(int(mine.sum()))
        return texts, counts

    def _line(self, image, box, score, scale):
        """This line's text, or None: too small, too faint, or read less surely than min_confidence."""
        width, height = (box[2] - box[0]) * scale, (box[3] - box[1]) * scale
        if width < self.min_height or height < self.min_height or score < self.min_box_score:
            return None
        probs = _infer(ORIENTATION, {self.orientation.image.name: _crop(image, box, self.orientation.preprocess)},
                       [self.orientation.scores_output.name])[self.orientation.scores_output.name][0]
        flipped = probs.argmax() == FLIPPED and probs.max() >= self.flip_threshold
        crop = _crop(image, box, self.recognizer.preprocess)
        if flipped:  # as read_text: the preprocessed line, upside down
            crop = np.ascontiguousarray(np.flip(crop, axis=(-2, -1)))
        read = _infer(RECOGNIZER, {self.recognizer.image.name: crop}, ["TEXT", "CONFIDENCE"])
        confidence = np.nan_to_num(read["CONFIDENCE"][0, 0])
        return read["TEXT"][0, 0] if confidence >= self.min_confidence else None


def _crop(image, box, spec):
    batch = np.empty((1, *spec.input_shape), spec.numpy_dtype)
    preprocess_region(image, tuple(box), spec, batch[0])
    return batch


def _infer(model, inputs, outputs):
    request = pb_utils.InferenceRequest(model_name=model, requested_output_names=outputs,
                                        inputs=[pb_utils.Tensor(name, value) for name, value in inputs.items()])
    response = request.exec()
    if response.has_error():
        raise pb_utils.TritonModelException(f"{model}: {response.error().message()}")
    return {name: pb_utils.get_output_tensor_by_name(response, name).as_numpy() for name in outputs}
