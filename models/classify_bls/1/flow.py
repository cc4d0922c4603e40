"""classify_bls: a cheap classifier first; the images it is unsure about go to resnet50.

    cheap model on every image ─> top-1 >= cascade_threshold     ROUTE <cheap>:confident
                              └─> the unsure ones, ONE call ─> main model
                                                                 ROUTE <main>:escalated
                                  (no main model READY, or too late for them under
                                  overload: the cheap answer stands) ROUTE <cheap>:degraded
    a request with skip_cascade: its images join that call       ROUTE <main>:direct
    no cheap model READY, or cascade_classifiers "none":
    main model on every image ─> top-1 >= tta_threshold          ROUTE <main>:direct
                             └─> the unsure ones mirrored, ONE call, probabilities averaged
                                                                 ROUTE <main>:flip_tta
"""

from typing import Optional

from bls_pipeline.flow import Answer, Batch, Candidates, NoModelReady, Parameters, Probability, Settings


class ClassifySettings(Settings):
    cascade_classifiers: Optional[Candidates] = (  # "none": off
        "efficientnet_lite0_trt,efficientnet_lite0_openvino,efficientnet_lite0_int8,efficientnet_lite0_onnx")
    cascade_threshold: Probability = 0.5  # cheap top-1 under this: escalated
    # the main classifier
    classifiers: Candidates = "resnet50_trt,resnet50_torch,resnet50_openvino,resnet50_int8,resnet50_onnx"
    tta_threshold: Probability = 0.25  # main path: top-1 under this adds a mirrored pass; 0: off


class ClassifyParameters(Parameters):
    skip_cascade: bool = False  # this request's images go straight to the main classifier


def flow(batch: Batch, settings: ClassifySettings) -> Answer:
    answer = batch.answer()
    skip = batch.params.skip_cascade
    cheap = batch.classify(settings.cascade_classifiers, rows=~skip)
    if cheap is not None:
        answer.set(cheap, "confident")
        unsure = cheap.top1 < settings.cascade_threshold
        # The unsure ones have the cheap answer already: skipped under overload (optional).
        main = batch.classify(settings.classifiers, rows=unsure | skip, optional=unsure)
        if main is None:
            fallback = batch.classify(settings.cascade_classifiers, rows=skip) if skip.any() else None
            if fallback is not None:  # they asked for the main model, which is not READY: the cheap one answers
                answer.set(fallback, "degraded")
            return answer.set(cheap[unsure], "degraded")
        answer.set(main[unsure], "escalated")
        return answer.set(main[skip], "direct")

    main = batch.classify(settings.classifiers)
    if main is None:
        raise NoModelReady
    answer.set(main, "direct")
    unsure = main.top1 < settings.tta_threshold
    if unsure.any():
        mirrored = batch.classify(main.model, rows=unsure, flip=True)
        if mirrored is not None:
            answer.set(main.mean(mirrored), "flip_tta")
    return answer
