"""Photo usability scores from a 64x64 greyscale thumbnail: numpy only, no weights.

    BRIGHTNESS  mean pixel value, 0 (black) .. 1 (white)
    CONTRAST    standard deviation of the pixels, 0 (one flat colour) .. 0.5
    SHARPNESS   mean absolute Laplacian (edges), 0 (flat or blurred) .. about 1
"""

import numpy as np


def measure(inputs: dict) -> dict:
    gray = inputs["GRAY"][..., 0].astype(np.float32) / 255.0  # (n, 64, 64)
    laplacian = (4 * gray[:, 1:-1, 1:-1]
                 - gray[:, :-2, 1:-1] - gray[:, 2:, 1:-1] - gray[:, 1:-1, :-2] - gray[:, 1:-1, 2:])
    return {
        "BRIGHTNESS": gray.mean(axis=(1, 2)).reshape(-1, 1),
        "CONTRAST": gray.std(axis=(1, 2)).reshape(-1, 1),
        "SHARPNESS": np.abs(laplacian).mean(axis=(1, 2)).reshape(-1, 1),
    }
