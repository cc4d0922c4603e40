"""triage_bls: unusable photos are answered at once; the rest get two classifiers' vote.

    image_quality on every image ─> too dark                     ROUTE image_quality:too_dark
                                 └> one flat colour              ROUTE image_quality:blank
                                    (no classifier call for either)
    the usable ones ─> first_voter and second_voter, TWO calls in flight together
                    └> probabilities averaged; both top-1 the same  ROUTE <a>+<b>:agree
                                                       otherwise    ROUTE <a>+<b>:disagree
                       one voter READY: its answer                  ROUTE <model>:alone
    no image_quality READY: every image is usable.
"""

from bls_pipeline.flow import Answer, Batch, Candidates, Classify, NoModelReady, Probability, Settings


class TriageSettings(Settings):
    quality: Candidates = "image_quality"
    first_voter: Candidates = (
        "efficientnet_lite0_trt,efficientnet_lite0_openvino,efficientnet_lite0_int8,efficientnet_lite0_onnx")
    second_voter: Candidates = "resnet50_trt,resnet50_torch,resnet50_openvino,resnet50_int8,resnet50_onnx"
    min_brightness: Probability = 0.08  # mean brightness under this: too dark to classify
    min_contrast: Probability = 0.02  # pixel spread under this: one flat colour


def flow(batch: Batch, settings: TriageSettings) -> Answer:
    answer = batch.answer()
    quality = batch.infer(settings.quality)
    if quality is not None:
        dark = quality["BRIGHTNESS"][:, 0] < settings.min_brightness
        blank = ~dark & (quality["CONTRAST"][:, 0] < settings.min_contrast)
        answer.skip(dark, f"{quality.model}:too_dark")
        answer.skip(blank, f"{quality.model}:blank")

    usable = answer.pending
    first, second = batch.together(Classify(settings.first_voter, rows=usable),
                                   Classify(settings.second_voter, rows=usable))
    if first is None and second is None:
        raise NoModelReady
    if first is None or second is None:
        return answer.set(first or second, "alone")
    vote = first.mean(second)
    agree = first.top1_class == second.top1_class
    answer.set(vote[agree], "agree")
    return answer.set(vote[~agree], "disagree")
