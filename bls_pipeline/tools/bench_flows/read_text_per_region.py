
# ---- read_text_per_region: read_text's flow (above) with this read_lines --------------------
# read_text's work, with one child request per region, the way hand-written BLS examples call
# a second-stage model (a loop over the regions, one InferenceRequest each). bls-bench writes
# read_text's flow.py, then this, as the baseline's flow.py: this read_lines replaces
# read_text's, so the detector call (ONE, as read_text's: the comparison is the regions'),
# the crops, their preprocessing and the answers are read_text's own.
#
#     for each line:  text_orientation, ONE request for this line
#                     text_recognizer,  ONE request for this line (turned round if flipped)


def read_lines(lines, readable, per_line: Answer, settings: ReadTextSettings):  # noqa: F811 - read_text's, replaced
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
    return text, confidence
