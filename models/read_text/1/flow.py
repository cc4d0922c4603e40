"""read_text: find the lines of text in each image, read each line, answer with the text.

    text_detector on every image, ONE call ─> regions: one row per line, cut from the image
       │                                      decoded once
       ├─ lower than min_height pixels: not read                   REGION_ROUTE too_small
       ├─ detector score under min_box_score: not read             REGION_ROUTE faint
       └─ the rest: text_orientation on every line of every image, ONE call
            ├─ "180" with p >= flip_threshold: read upside down    REGION_ROUTE text_orientation:flipped
            └─ otherwise: read as it is                            REGION_ROUTE text_orientation:upright
            text_recognizer on both groups, TWO calls in flight together ─> REGION_TEXT, REGION_CONFIDENCE
    each image: TEXT = its lines read with confidence >= min_confidence, top to bottom
                                                  ROUTE text_detector:text, or text_detector:no_text
    no text_orientation READY (or "none"): every line is read as it is ROUTE text_recognizer:unoriented
"""

from typing import Optional

import numpy as np

from bls_pipeline.flow import Answer, Batch, Candidates, Infer, NoModelReady, Probability, Settings


class ReadTextSettings(Settings):
    detector: Candidates = "text_detector"
    orientation: Optional[Candidates] = "text_orientation"  # "none": every line read as it is
    recognizer: Candidates = "text_recognizer"
    min_height: float = 8.0  # lines lower than this (pixels of the image as sent) are not read
    min_box_score: Probability = 0.6  # the detector's score under this: too faint to read
    flip_threshold: Probability = 0.9  # orientation's "180" at least this sure: read upside down
    min_confidence: Probability = 0.5  # lines read less surely than this stay out of TEXT


def flow(batch: Batch, settings: ReadTextSettings) -> Answer:
    answer = batch.answer()
    found = batch.infer(settings.detector)
    if found is None:
        raise NoModelReady
    lines = batch.regions(found, min_size=settings.min_height)
    per_line = lines.answer()
    per_line.skip(lines.too_small, "too_small")
    faint = ~lines.too_small & (lines.score < settings.min_box_score)
    per_line.skip(faint, "faint")
    readable = ~lines.too_small & ~faint

    text, confidence = read_lines(lines, readable, per_line, settings)
    per_line.output("REGION_TEXT", text).output("REGION_CONFIDENCE", confidence)

    sure = readable & (confidence >= settings.min_confidence)
    image_text = [b"\n".join(text[sure & (lines.image == i)]) for i in range(len(batch))]
    has_text = np.array([bool(t) for t in image_text])
    answer.skip(has_text, f"{found.model}:text").skip(~has_text, f"{found.model}:no_text")
    answer.output("TEXT", np.array(image_text, dtype=object))
    return answer.attach(per_line)


def read_lines(lines, readable, per_line: Answer, settings: ReadTextSettings):
    """The readable lines' text and confidence, each line's ROUTE set in per_line: the
    orientation of every line in ONE call, then the recogniser on the upright and the
    flipped ones, TWO calls in flight together."""
    orientation = lines.classify(settings.orientation, rows=readable)
    if orientation is None:
        flipped = np.zeros(len(lines), dtype=bool)
        per_line.skip(readable, "text_recognizer:unoriented")
    else:
        flipped = readable & (orientation.top1_class == 1) & (orientation.top1 >= settings.flip_threshold)
        per_line.set(orientation[readable & ~flipped], "upright")
        per_line.set(orientation[flipped], "flipped")

    upright, rotated = lines.together(Infer(settings.recognizer, rows=readable & ~flipped),
                                      Infer(settings.recognizer, rows=flipped, rotate=180))
    if upright is None:
        raise NoModelReady
    text = np.where(flipped, rotated["TEXT"][:, 0], upright["TEXT"][:, 0])
    confidence = np.nan_to_num(np.where(flipped, rotated["CONFIDENCE"][:, 0], upright["CONFIDENCE"][:, 0]))
    return text, confidence
