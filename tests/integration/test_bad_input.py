"""Bad and unusual inputs against the real server, alone and inside busy dynamic batches.

Every payload is built here, in memory. The contract under test:

* an invalid image fails its own request with "IMAGE[<index>]: <reason>", an
  INVALID_ARGUMENT error, and a message with nothing internal in it (no traceback, no
  path, no shared-memory region name);
* a request Triton itself refuses (wrong dtype, wrong shape, batch too large) gets
  Triton's message naming the problem; one without IMAGE is refused by the model;
* a valid but unusual image (alpha, colour key, 16-bit, CMYK, EXIF rotation, animation,
  pages, slivers) is classified like a plain RGB image of the same content, and not
  like what a decoder that got it wrong would see;
* good requests in the same dynamic batches get their own answers;
* the server still serves afterwards.

The classifier has seeded random weights, so its top-1 class is the same for almost
every picture: results are compared on the whole probability vector (TOPK=1000) instead.
"""

from __future__ import annotations

import importlib
import io
import math
import re
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from PIL import Image
from tritonclient.utils import InferenceServerException

from bls_pipeline.serve.client import ClassifyClient
from bls_pipeline.contract import BLS_MODEL, NUM_CLASSES
from bls_pipeline.base.modelconfig import parse_config, string_parameters
from bls_pipeline.runtime.load.settings import RuntimeSettings, parse_settings
from bls_pipeline.runtime.load.loader import load_flow

pytestmark = pytest.mark.integration

PROTOCOLS = ("http", "grpc")
MODES = ("alone", "among-good")  # sent on its own, or concurrently with good requests
TOPK = NUM_CLASSES  # the whole distribution, not just a top-1 that random weights share
# Each request's deadline, which the flow aims at: an unsure image goes on to resnet50 however
# busy the machine (without one it aims at classify_bls's 400 ms, and may come back degraded),
# so a route compared between two images says how they decoded, not how loaded the machine was.
DEADLINE_S = 30.0
EXACT = 1e-3  # same pixels reach the classifier: only batch-size numerics differ (~1e-6)
LOSSY = 2e-2  # JPEG re-encoding of the same content (measured ~2e-3)
CLIENT_ERROR = ("400", "StatusCode.INVALID_ARGUMENT")  # HTTP, gRPC
BAD_INDEX = 37  # the bad image among 64


# ---- payloads ------------------------------------------------------------------------

def _encode(img: Image.Image, fmt: str, **save_kwargs) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **save_kwargs)
    return buf.getvalue()


def _png(pixels: np.ndarray) -> bytes:
    return _encode(Image.fromarray(pixels), "PNG")


def _scene(seed: int, width: int = 320, height: int = 240) -> Image.Image:
    """Photo-like RGB: smooth gradients and an off-centre block, so rotating, flipping or
    mis-converting colours all change what the classifier sees."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    u, v = x / (width - 1), y / (height - 1)
    a, b, c = rng.uniform(2.0, 8.0, 3)
    rgb = np.stack([u, v, 0.5 + 0.5 * np.sin(a * u + b * v + c)], axis=-1)
    rgb[int(height * 0.15):int(height * 0.45), int(width * 0.6):int(width * 0.9)] = rng.uniform(0.0, 1.0, 3)
    return Image.fromarray((rgb * 255.0 + 0.5).astype(np.uint8), "RGB")


def _solid(colour: tuple[int, int, int], size: tuple[int, int] = (256, 256)) -> bytes:
    return _encode(Image.new("RGB", size, colour), "PNG")


def _png_claiming_size(width: int, height: int) -> bytes:
    """A 4x4 PNG whose IHDR says width x height, CRC fixed: only the size lies."""
    data = bytearray(_encode(Image.new("RGB", (4, 4), (255, 0, 0)), "PNG"))
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


@dataclass(frozen=True)
class ImageCase:
    """Sent with ClassifyClient. error: regex for the reason after "IMAGE[index]: ";
    None means valid, and then `like` is a plain RGB image of the same content and
    `unlike` what a decoder that got this case wrong would have seen."""

    images: tuple[bytes, ...]
    error: str | None = None
    index: int = 0
    like: bytes | None = None
    unlike: bytes | None = None
    tol: float = EXACT


@dataclass(frozen=True)
class RawCase:
    """Sent with raw tritonclient: what ClassifyClient cannot send (wrong dtype or shape,
    too large a batch, no IMAGE). error: regex for the message."""

    inputs: Callable[[Any], list]  # tritonclient.http or .grpc -> its InferInputs
    error: str


def _invalid_cases(limits: RuntimeSettings) -> dict[str, ImageCase]:
    truncated = _encode(Image.effect_noise((300, 200), 64).convert("RGB"), "JPEG")
    bad_crc = bytearray(_encode(_scene(1, 16, 16), "PNG"))
    bad_crc[29] ^= 0xFF  # the IHDR chunk's CRC; the signature is intact
    sig = b"\x89PNG\r\n\x1a\n"
    side = math.isqrt(limits.decode.max_pixels) + 1  # just over our limit, under Pillow's own
    not_an_image = r"^not a decodable image \(allowed formats: [A-Z, ]*\bPNG\b"
    return {
        "empty": ImageCase((b"",), r"^empty image payload \(0 bytes\)$"),
        "random-bytes": ImageCase((np.random.default_rng(7).integers(0, 256, 4096, dtype=np.uint8).tobytes(),),
                                  not_an_image),
        "html": ImageCase((b"<!DOCTYPE html><html><body><h1>404 Not Found</h1></body></html>",), not_an_image),
        "svg": ImageCase((b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg" width="64" height="64">'
                          b'<circle cx="32" cy="32" r="20" fill="red"/></svg>',), not_an_image),
        "truncated-jpeg": ImageCase((truncated[: len(truncated) // 2],),
                                    r"^cannot decode JPEG image: image file is truncated"),
        "png-bad-crc": ImageCase((bytes(bad_crc),), r"^cannot read PNG header: .*checksum.*IHDR"),
        # A chunk name holding '/': Pillow quotes it; the client must not get its bytes back.
        "png-bad-chunk-name": ImageCase((sig + struct.pack(">I", 13) + b"IH/R" + bytes(17),),
                                        r"^cannot read PNG header: broken PNG file"),
        "bomb-50000x50000": ImageCase((_png_claiming_size(50_000, 50_000),),
                                      rf"^image declares more than {limits.decode.max_pixels} pixels"),
        "over-max-pixels": ImageCase(
            (_png_claiming_size(side, side),),
            rf"^image is {side}x{side} = {side * side} pixels, over the {limits.decode.max_pixels}-pixel limit"),
    }


def _valid_cases() -> dict[str, ImageCase]:
    cases: dict[str, ImageCase] = {}
    scene = _scene(2)
    rgb = np.asarray(scene)

    cases["1x1"] = ImageCase((_encode(Image.new("RGB", (1, 1), (30, 140, 220)), "PNG"),), like=_solid((30, 140, 220)))
    # Thirds red / teal / blue along the long side: the centre crop sees teal only; a crop
    # taken from the start (or a squashed resize) would not.
    thirds = np.empty((20_000, 1, 3), np.uint8)
    thirds[:6_667], thirds[6_667:13_334], thirds[13_334:] = (220, 30, 30), (20, 160, 150), (30, 30, 220)
    for name, pixels in (("sliver-1x20000", thirds), ("sliver-20000x1", thirds.transpose(1, 0, 2))):
        cases[name] = ImageCase((_png(np.ascontiguousarray(pixels)),), like=_solid((20, 160, 150)),
                                unlike=_solid((220, 30, 30)))

    grey = np.asarray(scene.convert("L"))
    cases["grey-16bit-png"] = ImageCase(
        (_encode(Image.fromarray(grey.astype(np.uint16) * 257), "PNG"),),  # I;16, full 16-bit range
        like=_png(np.repeat(grey[..., None], 3, axis=2)),
        unlike=_png(np.full_like(grey, 255)))  # convert("L") clips every value >= 255: white

    cases["cmyk-jpeg"] = ImageCase(
        (_encode(scene.convert("CMYK"), "JPEG", quality=95),),
        like=_png(rgb), unlike=_png(255 - rgb), tol=LOSSY)  # unlike: Adobe inversion got wrong

    palette = scene.quantize(64)
    index = np.asarray(palette).copy()
    index[: index.shape[0] * 2 // 5] = 0  # top 40% transparent (tRNS: index 0)
    pal_img = Image.fromarray(index, "P")
    pal_img.putpalette(palette.getpalette())
    opaque = np.asarray(pal_img.convert("RGB"))
    cases["palette-png-transparency"] = ImageCase(
        (_encode(pal_img, "PNG", transparency=0),),
        like=_png(np.where((index == 0)[..., None], np.uint8(255), opaque)), unlike=_png(opaque))

    alpha = np.full(grey.shape, 255, np.uint8)
    alpha[:, grey.shape[1] * 3 // 5:] = 0  # right 40% transparent
    grey_rgb = np.repeat(grey[..., None], 3, axis=2)
    cases["la-png"] = ImageCase(
        (_encode(Image.merge("LA", (Image.fromarray(grey), Image.fromarray(alpha))), "PNG"),),
        like=_png(np.where((alpha == 0)[..., None], np.uint8(255), grey_rgb)), unlike=_png(grey_rgb))

    # A PNG tRNS colour key on a truecolour / greyscale image: the same picture as the
    # palette case, written by an encoder that chose another colour type.
    keyed = rgb.copy()
    keyed[: keyed.shape[0] * 2 // 5] = (1, 2, 3)
    cases["rgb-png-colour-key"] = ImageCase(
        (_encode(Image.fromarray(keyed), "PNG", transparency=(1, 2, 3)),),
        like=_png(np.where(np.all(keyed == (1, 2, 3), axis=2)[..., None], np.uint8(255), keyed)), unlike=_png(keyed))
    keyed_grey = grey.copy()
    keyed_grey[:, : grey.shape[1] * 2 // 5] = 7
    cases["grey-png-colour-key"] = ImageCase(
        (_encode(Image.fromarray(keyed_grey), "PNG", transparency=7),),
        like=_png(np.repeat(np.where(keyed_grey == 7, np.uint8(255), keyed_grey)[..., None], 3, axis=2)),
        unlike=_png(np.repeat(keyed_grey[..., None], 3, axis=2)))

    frames = [_scene(3).quantize(256), _scene(4).quantize(256)]  # palette frames: GIF keeps them exactly
    cases["animated-gif"] = ImageCase(
        (_encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=40, loop=0),),
        like=_png(np.asarray(frames[0].convert("RGB"))), unlike=_png(np.asarray(frames[1].convert("RGB"))))
    cases["animated-webp"] = ImageCase(
        (_encode(_scene(5), "WEBP", save_all=True, append_images=[_scene(6)], lossless=True, duration=40),),
        like=_png(np.asarray(_scene(5))), unlike=_png(np.asarray(_scene(6))))
    cases["multipage-tiff"] = ImageCase(
        (_encode(_scene(7), "TIFF", save_all=True, append_images=[_scene(8), _scene(9)]),),
        like=_png(np.asarray(_scene(7))), unlike=_png(np.asarray(_scene(8))))

    exif = Image.Exif()
    exif[0x0112] = 6  # orientation 6: rotate 90 degrees clockwise to display
    jpeg = _encode(_scene(10), "JPEG", quality=90, exif=exif)
    stored = Image.open(io.BytesIO(jpeg)).convert("RGB")  # the pixels as stored, no EXIF applied
    cases["exif-rotated-jpeg"] = ImageCase(
        (jpeg,), like=_png(np.asarray(stored.transpose(Image.Transpose.ROTATE_270))), unlike=_png(np.asarray(stored)))
    return cases


def _raw_cases() -> dict[str, RawCase]:
    def image(dtype: str, shape: list[int], values: np.ndarray) -> Callable[[Any], list]:
        def build(tc):
            tensor = tc.InferInput("IMAGE", shape, dtype)
            tensor.set_data_from_numpy(values)
            return [tensor]
        return build

    def topk_only(tc):
        tensor = tc.InferInput("TOPK", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[3]], np.int32))
        return [tensor]

    def fp32_topk(tc):
        (img,) = image("BYTES", [1, 1], np.array([[b"x"]], dtype=object))(tc)
        topk = tc.InferInput("TOPK", [1, 1], "FP32")
        topk.set_data_from_numpy(np.array([[3.0]], np.float32))
        return [img, topk]

    wrong_type = r"inference input 'IMAGE' data-type is '{}', but model 'classify_bls' expects 'BYTES'"
    return {
        "image-as-int32": RawCase(image("INT32", [1, 1], np.array([[1]], np.int32)), wrong_type.format("INT32")),
        "image-as-fp32": RawCase(image("FP32", [1, 1], np.array([[1.0]], np.float32)), wrong_type.format("FP32")),
        "image-shape-1x2": RawCase(image("BYTES", [1, 2], np.array([[b"a", b"b"]], dtype=object)),
                                   r"unexpected shape for input 'IMAGE' for model 'classify_bls'\. Expected \[-1,1\], "
                                   r"got \[1,2\]"),
        "batch-of-65": RawCase(image("BYTES", [65, 1], np.full((65, 1), b"x", dtype=object)),
                               r"batch-size must be <= 64 for 'classify_bls'"),
        "topk-as-fp32": RawCase(fp32_topk,
                                r"inference input 'TOPK' data-type is 'FP32', but model 'classify_bls' expects "
                                r"'INT32'"),
        # Triton checks the number of inputs, not their names: a request with only the
        # optional TOPK reaches the model, which must refuse it itself.
        "missing-image": RawCase(topk_only, r"^IMAGE\b"),
    }


INVALID = ["empty", "random-bytes", "html", "svg", "truncated-jpeg", "png-bad-crc", "png-bad-chunk-name",
           "bomb-50000x50000", "over-max-pixels"]
VALID = ["1x1", "sliver-1x20000", "sliver-20000x1", "grey-16bit-png", "cmyk-jpeg", "palette-png-transparency",
         "la-png", "rgb-png-colour-key", "grey-png-colour-key", "animated-gif", "animated-webp", "multipage-tiff",
         "exif-rotated-jpeg"]
RAW = ["image-as-int32", "image-as-fp32", "image-shape-1x2", "batch-of-65", "topk-as-fp32", "missing-image"]


# ---- sending and checking ----------------------------------------------------------------

def _url(server, protocol: str) -> str:
    return server.url(protocol)


def _send(server, protocol: str, case: ImageCase | RawCase):
    """One request on its own client (tritonclient.http's client is not thread-safe);
    returns the outputs or the InferenceServerException."""
    url = _url(server, protocol)
    try:
        if isinstance(case, RawCase):
            tc = importlib.import_module(f"tritonclient.{protocol}")
            client = tc.InferenceServerClient(url)
            try:
                return client.infer(BLS_MODEL, case.inputs(tc))
            finally:
                client.close()
        client = ClassifyClient(url, protocol)
        try:
            return client.classify(list(case.images), topk=TOPK, timeout_s=DEADLINE_S)
        finally:
            client.close()
    except InferenceServerException as exc:
        return exc


def _distributions(out: dict[str, np.ndarray], n: int) -> tuple[np.ndarray, list[str]]:
    """(n, 1000) probabilities and the n routes, after checking the output contract."""
    labels, scores, ids, routes = out["LABELS"], out["SCORES"], out["CLASS_IDS"], out["ROUTE"]
    assert labels.shape == scores.shape == ids.shape == (n, TOPK) and routes.shape == (n, 1)
    assert (np.sort(ids, axis=1) == np.arange(NUM_CLASSES)).all(), "TOPK=1000 must list every class once"
    probs = np.zeros((n, NUM_CLASSES), np.float64)
    np.put_along_axis(probs, ids.astype(np.int64), scores, axis=1)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-3)
    for row in range(n):
        score, index, _ = labels[row, 0].decode().split(":", 2)
        assert int(index) == ids[row, 0] and abs(float(score) - scores[row, 0]) < 1e-5
    route_names = [r.decode() for r in routes[:, 0]]
    assert all(re.fullmatch(r"[a-z0-9_]+:[a-z_]+", r) for r in route_names), route_names  # "<classifier>:<branch>"
    return probs, route_names


def _assert_client_safe(message: str) -> None:
    for leak in ("Traceback", ".py", "triton_python_backend_shm", "\n  File "):
        assert leak not in message, f"{leak!r} leaked into the client's message: {message!r}"


def _assert_image_error(result, index: int, reason: str) -> None:
    assert isinstance(result, InferenceServerException), f"expected an error naming IMAGE[{index}], got {result!r}"
    message = result.message()
    prefix = f"IMAGE[{index}]: "
    assert message.startswith(prefix), message
    assert re.search(reason, message[len(prefix):]), f"{message!r} does not match {reason!r}"
    assert "/" not in message[len(prefix):], message
    _assert_client_safe(message)
    assert result.status() in CLIENT_ERROR, f"a bad image is the client's fault, got status {result.status()}"


def _assert_like(result, case: ImageCase, reference) -> None:
    assert not isinstance(result, Exception), f"a valid image was refused: {result}"
    (probs,), (route,) = _distributions(result, 1)
    like, like_route = reference[case.like]
    assert route == like_route
    assert np.abs(probs - like).max() <= case.tol, "classified unlike a plain RGB image of the same content"
    if case.unlike is not None:
        assert np.abs(probs - reference[case.unlike][0]).max() > 2 * case.tol, "classified like a wrong decoding"


# ---- fixtures ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def limits(server) -> RuntimeSettings:
    """classify_bls's effective settings, read from the config.pbtxt the server loaded."""
    model_dir = Path(server.options.model_repository) / BLS_MODEL
    runtime, _ = parse_settings(string_parameters(parse_config(model_dir)),
                                load_flow(model_dir / "1" / "flow.py").settings, BLS_MODEL)
    return runtime


@pytest.fixture(scope="module")
def cases(limits) -> dict[str, ImageCase | RawCase]:
    built = {**_invalid_cases(limits), **_valid_cases(), **_raw_cases()}
    expected = set(INVALID) | set(VALID) | {p if isinstance(p, str) else p.values[0] for p in RAW}
    assert set(built) == expected
    return built


@pytest.fixture(scope="module")
def good_images() -> list[bytes]:
    """Small, distinct, plain images: the good neighbours and the 64-image batch."""
    return [_encode(_scene(100 + i, 96, 72), "JPEG", quality=90) for i in range(8)]


@pytest.fixture(scope="module")
def reference(server, cases, good_images) -> dict[bytes, tuple[np.ndarray, str]]:
    """Probabilities and route of every plain image (like, unlike, good), in one request."""
    plain = list(dict.fromkeys(good_images + [img for c in cases.values() if isinstance(c, ImageCase)
                                              for img in (c.like, c.unlike) if img is not None]))
    client = ClassifyClient(server.grpc_url, "grpc")
    try:
        probs, routes = _distributions(client.classify(plain, topk=TOPK, timeout_s=DEADLINE_S), len(plain))
    finally:
        client.close()
    return {img: (p, r) for img, p, r in zip(plain, probs, routes)}


def _executions(server) -> int:
    """classify_bls execute() calls so far (Triton's statistics API)."""
    import tritonclient.http as tc

    client = tc.InferenceServerClient(server.http_url)
    try:
        return int(client.get_inference_statistics(BLS_MODEL)["model_stats"][0]["execution_count"])
    finally:
        client.close()


def _with_neighbours(server, protocol: str, cases: list, good: list[bytes], per_case: int = 2) -> tuple[list, list]:
    """Each case followed by `per_case` good requests, 8 in flight: they share dynamic
    batches. Returns (case results, [(good image, result)])."""
    jobs: list[tuple[str, Any, bytes | None]] = []
    for i, case in enumerate(cases):
        jobs.append(("case", case, None))
        for j in range(per_case):
            img = good[(i * per_case + j) % len(good)]
            jobs.append(("good", ImageCase((img,)), img))
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda job: _send(server, protocol, job[1]), jobs))
    case_results = [r for (kind, _, _), r in zip(jobs, results) if kind == "case"]
    good_results = [(img, r) for (kind, _, img), r in zip(jobs, results) if kind == "good"]
    return case_results, good_results


def _assert_good_answers(good_results, reference) -> None:
    for img, result in good_results:
        assert not isinstance(result, Exception), f"a good neighbour failed: {result}"
        (probs,), (route,) = _distributions(result, 1)
        expected, expected_route = reference[img]
        assert route == expected_route
        assert np.abs(probs - expected).max() <= EXACT, "a good neighbour got another request's answer"


@pytest.fixture(scope="module")
def traffic(server, cases, good_images, reference):
    """Per protocol, once: every case of the matrix sent among good requests."""
    done: dict[str, dict] = {}

    def run(protocol: str) -> dict:
        if protocol not in done:
            names = list(cases)
            before = _executions(server)
            results, good = _with_neighbours(server, protocol, [cases[n] for n in names], good_images)
            reached_model = len(good) + sum(isinstance(cases[n], ImageCase) for n in names)  # at least these
            done[protocol] = {"cases": dict(zip(names, results)), "good": good,
                              "reached_model": reached_model, "executions": _executions(server) - before}
        return done[protocol]

    return run


@pytest.fixture(scope="module")
def outcome(server, cases, traffic):
    def get(name: str, protocol: str, mode: str):
        return _send(server, protocol, cases[name]) if mode == "alone" else traffic(protocol)["cases"][name]

    return get


# ---- the matrix --------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("name", INVALID)
def test_invalid_image_fails_its_own_request(outcome, cases, name, protocol, mode):
    case = cases[name]
    _assert_image_error(outcome(name, protocol, mode), case.index, case.error)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("name", VALID)
def test_unusual_image_is_classified_like_plain_rgb(outcome, cases, reference, name, protocol, mode):
    _assert_like(outcome(name, protocol, mode), cases[name], reference)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("name", RAW)
def test_malformed_request_is_refused_naming_the_problem(outcome, cases, name, protocol, mode):
    result = outcome(name, protocol, mode)
    assert isinstance(result, InferenceServerException), f"accepted: {result!r}"
    message = result.message()
    assert re.search(cases[name].error, message), message
    assert "/" not in message
    _assert_client_safe(message)
    assert result.status() in CLIENT_ERROR, result.status()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_good_neighbours_share_batches_and_get_their_own_answers(traffic, reference, protocol):
    run = traffic(protocol)
    assert len(run["good"]) == 2 * len(run["cases"])
    _assert_good_answers(run["good"], reference)
    # Fewer execute() calls than requests: some batches held several requests, bad ones included.
    assert 0 < run["executions"] < run["reached_model"], {k: run[k] for k in ("executions", "reached_model")}


# ---- sizes and batches -------------------------------------------------------------------

@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_request_far_larger_than_any_image(server, limits, good_images, reference, protocol):
    """One IMAGE element over max_request_bytes: the request limit answers (Triton 2.51
    itself accepts it over both protocols), alone and among good requests."""
    size = limits.max_request_bytes + 16 * 2**20  # 80 MiB with the default 64 MiB limit
    huge = ImageCase((b"\xff\xd8\xff" + bytes(size - 3),))
    reason = rf"^IMAGE: the request carries {size} bytes of images, over the {limits.max_request_bytes}-byte limit"
    alone = _send(server, protocol, huge)
    (among,), good = _with_neighbours(server, protocol, [huge], good_images, per_case=6)
    for result in (alone, among):
        assert isinstance(result, InferenceServerException), result
        assert re.search(reason, result.message()), result.message()
        _assert_client_safe(result.message())
        assert result.status() in CLIENT_ERROR
    _assert_good_answers(good, reference)


def test_image_over_max_image_bytes(server, limits):
    size = limits.decode.max_bytes + 8 * 2**20
    assert size <= limits.max_request_bytes, "the request limit would answer first"
    result = _send(server, "grpc", ImageCase((_encode(_scene(1, 64, 48), "PNG") + bytes(size),)))
    _assert_image_error(result, 0, rf"^image payload is \d+ bytes, over the {limits.decode.max_bytes}-byte limit")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_64_image_request_with_one_bad_image_names_its_index(server, good_images, protocol):
    images = [good_images[i % len(good_images)] for i in range(64)]
    images[BAD_INDEX] = b"<html>not an image</html>"
    _assert_image_error(_send(server, protocol, ImageCase(tuple(images))), BAD_INDEX, r"^not a decodable image")


def test_64_images_over_64_concurrent_requests_only_the_bad_one_fails(server, good_images, reference):
    requests = [ImageCase((good_images[i % len(good_images)],)) for i in range(64)]
    requests[BAD_INDEX] = ImageCase((b"<html>not an image</html>",))
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda case: _send(server, "grpc", case), requests))
    _assert_image_error(results[BAD_INDEX], 0, r"^not a decodable image")
    good = [(case.images[0], r) for i, (case, r) in enumerate(zip(requests, results)) if i != BAD_INDEX]
    _assert_good_answers(good, reference)


# ---- afterwards (keep last) --------------------------------------------------------------

@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_server_still_serves_after_the_matrix(server, good_images, reference, protocol):
    assert server.running()
    tc = importlib.import_module(f"tritonclient.{protocol}")
    client = tc.InferenceServerClient(_url(server, protocol))
    try:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(BLS_MODEL)
    finally:
        client.close()
    _assert_good_answers([(good_images[0], _send(server, protocol, ImageCase((good_images[0],))))], reference)
