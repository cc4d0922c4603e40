"""read_text_per_region: read_text's work, with one child request per region, the way
hand-written BLS examples call a second-stage model (a loop over the regions, one
InferenceRequest each). bls-bench serves it beside read_text to measure what batching the
regions buys; the crops, their preprocessing and the answers are read_text's.

    text_detector on every image, ONE call (as read_text: the comparison is the regions')
    for each line:  text_orientation, ONE request for this line
                    text_recognizer,  ONE request for this line (turned round if flipped)
"""

import numpy as np

from bls_pipeline.flow import Answer, Batch, Candidates, NoModelReady, Probability, Settings


class PerRegionSettings(Settings):
    detector: Candidates = "text_detector"
    orientation: Candidates = "text_orientation"
    recognizer: Candidates = "text_recognizer"
    min_height: float = 8.0
    min_box_score: Probability = 0.6
    flip_threshold: Probability = 0.9
    min_confidence: Probability = 0.5


def flow(batch: Batch, settings: PerRegionSettings) -> Answer:
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

    text = np.full(len(lines), b"", dtype=object)
    confidence = np.zeros(len(lines), np.float32)
    for line in np.flatnonzero(readable):
        orientation = lines.classify(settings.orientation, rows=[line])
        if orientation is None:
            raise NoModelReady
        flipped = orientation.top1_class[line] == 1 and orientation.top1[line] >= settings.flip_threshold
        per_line.set(orientation, "flipped" if flipped else "upright")
        read = lines.infer(settings.recognizer, rows=[line], rotate=180 if flipped else 0)
        if read is None:
            raise NoModelReady
        text[line], confidence[line] = read["TEXT"][line, 0], np.nan_to_num(read["CONFIDENCE"][line, 0])
    per_line.output("REGION_TEXT", text).output("REGION_CONFIDENCE", confidence)

    sure = readable & (confidence >= settings.min_confidence)
    image_text = [b"\n".join(text[sure & (lines.image == i)]) for i in range(len(batch))]
    has_text = np.array([bool(t) for t in image_text])
    answer.skip(has_text, f"{found.model}:text").skip(~has_text, f"{found.model}:no_text")
    answer.output("TEXT", np.array(image_text, dtype=object))
    return answer.attach(per_line)
