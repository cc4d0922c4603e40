"""bls-bench's options: where the server is (a running one on both protocols, or its own on the
ports given), the images it sends and what it says of them, and the queue bound and settings
it serves its repository copy with. Nothing starts a server here."""

import io
import shutil
from pathlib import Path

import pytest
from PIL import Image

from bls_pipeline.base.modelconfig import parse_config, string_parameters
from bls_pipeline.tools.bench_targets import (DEFAULT_TARGET, PEER, served_model, bench_repository, queue_bound,
                                              serve_with, served_description)
from bls_pipeline.tools.bench_images import HEAVY_SIZE, IMAGE_SIZE, announce, image_set
from bls_pipeline.tools.bench import Endpoints, parse_args
from bls_pipeline.tools.bench_sweep import Point, markdown
from bls_pipeline.tools.loadgen import TRITON_SUCCESS_COUNTS

MODELS = Path(__file__).resolve().parents[2] / "models"
SAMPLES = MODELS.parent / "samples"


# ---- the server ------------------------------------------------------------------------------
def test_a_running_server_is_reached_on_both_protocols_and_its_metrics():
    args = parse_args(["--url", "10.1.2.3:8131", "--http-port", "8130", "--metrics-port", "8132", "--overload"])
    assert args.running == Endpoints("10.1.2.3:8130", "10.1.2.3:8131", "http://10.1.2.3:8132/metrics")
    # --url alone: the other protocol and the metrics on Triton's default ports of its host
    assert (parse_args(["--url", "gpu-box:9001"]).running
            == Endpoints("gpu-box:8000", "gpu-box:9001", "http://gpu-box:8002/metrics"))
    assert parse_args(["--url", "gpu-box:9000", "--protocol", "http"]).running.url("http") == "gpu-box:9000"
    assert parse_args(["--host", "gpu-box", "--grpc-port", "9001"]).running == Endpoints(
        "gpu-box:8000", "gpu-box:9001", "http://gpu-box:8002/metrics")
    assert parse_args(["--host", "gpu-box", "--metrics-url", "http://proxy/triton/metrics"]).running.metrics == \
        "http://proxy/triton/metrics"


def test_without_url_or_host_bls_bench_starts_its_own_server_on_the_ports_given():
    args = parse_args(["--http-port", "8140", "--grpc-port", "8141"])
    assert args.running is None and (args.http_port, args.grpc_port, args.metrics_port) == (8140, 8141, None)


@pytest.mark.parametrize("argv, says", [
    (["--url", "h:8001", "--grpc-port", "9001"], "two grpc ports"),
    (["--url", "h:8001", "--host", "other"], "two hosts"),
    (["--url", "http://h:8001"], "HOST:PORT"),
    (["--metrics-url", "http://h:8002/metrics"], "running server"),
    (["--url", "h:8001", "--max-queue-size", "8"], "own copy"),
    (["--host", "h", "--set", "classify_bls.tta_threshold=0"], "own copy"),
])
def test_conflicting_server_options_are_refused_naming_them(argv, says, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2 and says in capsys.readouterr().err


# ---- the modes -------------------------------------------------------------------------------
def test_each_mode_has_its_own_defaults():
    sweep = parse_args([])
    assert (sweep.mode, sweep.deadline, sweep.protocol_list) == (None, None, ["grpc"])
    over = parse_args(["--overload", "--factor", "4,8"])
    assert (over.mode, over.factors, over.deadline, over.kinds, over.protocol_list) == (
        "overload", [4.0, 8.0], 0.5, ["deadline", "timeout"], ["grpc", "http"])
    assert over.targets[0] == DEFAULT_TARGET
    open_loop = parse_args(["--open-loop", "0.5,0.8,0.95", "--protocols", "grpc"])
    assert (open_loop.mode, open_loop.loads, open_loop.deadline, open_loop.kinds, open_loop.targets) == (
        "open_loop", [0.5, 0.8, 0.95], 2.0, ["deadline"], [DEFAULT_TARGET])
    assert (parse_args(["--open-loop", "0.8", "--clients", "deadline,timeout", "--deadline", "1"]).kinds
            == ["deadline", "timeout"])
    assert parse_args(["--open-loop", "0.8", "--capacity", "120"]).capacity == 120.0


@pytest.mark.parametrize("argv, says", [
    (["--overload", "--open-loop", "0.5"], "two runs"),
    (["--open-loop", "0.5,-1"], "numbers above 0"),
    (["--overload", "--factor", "four"], "--factor"),
    (["--capacity", "100"], "--open-loop"),
    (["--open-loop", "0.5", "--clients", "patient"], "unknown kind"),
    (["--image-size", "big"], "WxH"),
    (["--heavy-images", "-1"], "below 0"),
    (["--set", "latency_target_ms=0"], "MODEL.PARAMETER=VALUE"),
])
def test_bad_mode_options_are_refused_naming_them(argv, says, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2 and says in capsys.readouterr().err


# ---- the images ------------------------------------------------------------------------------
def test_by_default_the_images_are_resized_and_bls_bench_says_so_per_file():
    files = [SAMPLES / "chelsea.jpg", SAMPLES / "mug.jpg"]
    images = image_set(files, IMAGE_SIZE)
    assert images.changed and len(images.payloads) == 4  # each photo and its mirror
    assert all(Image.open(io.BytesIO(p)).size == IMAGE_SIZE for p in images.payloads)
    assert (images.notes[0].startswith("chelsea.jpg: 451x300 JPEG")
            and "centre-cropped to 400x300 (4:3), resized to 500x375" in images.notes[0])
    assert "mug.jpg: 800x600 JPEG" in images.notes[1] and "centre-cropped" not in images.notes[1]  # already 4:3
    said = announce(images, IMAGE_SIZE)
    assert "CHANGED" in said and "--image-size original" in said and all(note in said for note in images.notes)
    assert "not the files as given" in images.summary and "500x375" in images.summary


def test_original_sends_the_files_byte_for_byte_a_broken_one_included(tmp_path):
    shutil.copy(SAMPLES / "coffee.jpg", tmp_path)
    (tmp_path / "broken.jpg").write_bytes(b"not a jpeg")
    files = sorted(tmp_path.glob("*.jpg"))
    images = image_set(files, None)
    assert images.payloads == [f.read_bytes() for f in files] and not images.changed
    assert images.notes == ["broken.jpg: 0 KB, not an image Pillow reads: sent as given",
                            f"coffee.jpg: 600x400 JPEG, {(tmp_path / 'coffee.jpg').stat().st_size / 1024:.0f} KB: sent "
                            "as given"]
    assert "CHANGED" not in announce(images, None) and "as given" in images.summary
    with pytest.raises(ValueError, match="broken.jpg: Pillow cannot read it.*--image-size original"):
        image_set(files, IMAGE_SIZE)


def test_heavy_images_are_twelve_megapixel_jpegs_added_to_the_set():
    images = image_set([SAMPLES / "mug.jpg"], IMAGE_SIZE, heavy=2)
    assert len(images.payloads) == 4
    assert [Image.open(io.BytesIO(p)).size for p in images.payloads[2:]] == [HEAVY_SIZE, HEAVY_SIZE]
    assert (images.notes[-1].startswith("heavy 2: 4000x3000 JPEG (12 megapixels)")
            and "2 heavy 4000x3000 JPEGs" in images.summary)


def test_the_sweep_table_says_which_images_and_who_refused():
    point = Point("classify_bls", 32, 10.0, 50.0, 60.0, 70.0, 300, 12, 5.0, 40.0,
                  refused_by={"queue full": 9, "model": 3})
    table = markdown([point], [],
                     {"machine": "m", "versions": "v", "protocol": "grpc", "duration_s": 5, "warmup_s": 1, "rounds": 1,
                      "image_set": "12 JPEGs of 500x375 (not the files as given)", "served": "max_queue_size 64"})
    assert "| classify_bls | 32 | 10.0 | 50.0 | 60.0 | 70.0 | 12 | 9 / 0 / 3 |" in table
    assert "12 JPEGs of 500x375 (not the files as given)" in table and "max_queue_size 64" in table
    assert TRITON_SUCCESS_COUNTS in table  # the server-side columns divide by Triton's success count


# ---- the repository copy ---------------------------------------------------------------------
@pytest.fixture
def copy(tmp_path) -> Path:
    src = tmp_path / "models"
    shutil.copytree(MODELS, src,
                    ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data", "*.json", "*.xml", "*.bin", "__pycache__"))
    dst = tmp_path / "bench"
    bench_repository(src, dst, keep_branches=False, peers=("efficientnet_lite0_onnx",))
    return dst


def test_another_queue_bound_goes_to_classify_bls_its_variants_and_the_peers(copy):
    shipped = queue_bound(MODELS / "classify_bls")
    assert served_description(copy, [DEFAULT_TARGET], None, []) == \
        f"bls-bench's own server: {DEFAULT_TARGET} with {shipped} (as the repository configures it)"
    serve_with(copy, max_queue_size=64)
    for target in ("classify_bls", DEFAULT_TARGET, "cascade@0.5", "classify_bls_shadow",
                   f"{PEER}@efficientnet_lite0_onnx"):
        assert queue_bound(copy / served_model(target)) == "max_queue_size 64", target
    config = parse_config(copy / DEFAULT_TARGET)
    assert config.dynamic_batching.default_queue_policy.allow_timeout_override  # the rest of the policy kept
    assert queue_bound(copy / "resnet50_onnx") != "max_queue_size 64"  # the children keep theirs
    said = served_description(copy, [DEFAULT_TARGET, "cascade@0.5"], 64, [])
    assert (said
            == (f"bls-bench's own server: {DEFAULT_TARGET} with max_queue_size 64, cascade@0.5 with max_queue_size 64 "
                "(--max-queue-size)"))
    serve_with(copy, max_queue_size=0)
    assert queue_bound(copy / DEFAULT_TARGET) == "max_queue_size 0 (unbounded)"


def test_a_set_parameter_goes_to_that_model_or_to_every_classify_bls(copy):
    serve_with(copy, settings=[("classify_bls", "latency_target_ms", "0"), ("cascade@0.5", "cascade_threshold", "0.7")])
    for name in ("classify_bls", DEFAULT_TARGET, served_model("cascade@0.9"), "classify_bls_shadow"):
        assert string_parameters(parse_config(copy / name))["latency_target_ms"] == "0", name
    assert string_parameters(parse_config(copy / served_model("cascade@0.5")))["cascade_threshold"] == "0.7"
    assert string_parameters(parse_config(copy / served_model("cascade@0.9")))["cascade_threshold"] == "0.9"
    assert "latency_target_ms" not in string_parameters(parse_config(copy / f"{PEER}__efficientnet_lite0_onnx"))
    with pytest.raises(ValueError, match="no model nowhere"):
        serve_with(copy, settings=[("nowhere", "x", "1")])
