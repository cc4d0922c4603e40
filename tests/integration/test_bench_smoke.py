"""bls-bench keeps working: a few-second run against the session's server (the real numbers come
from a full run, see docs/performance.md); its own repository copy is checked in tests/unit/test_bench_ratios.py."""

import json
import shutil
import sys
from fractions import Fraction

import pytest

from bls_pipeline.serve.options import free_port
from bls_pipeline.tools import bench

pytestmark = pytest.mark.integration


# The photos the cascade point sends, in bls-bench's order (each, then its mirror), and
# whether efficientnet_lite0 is unsure of them at cascade@0.5 (top-1 ~0.38, ~0.94, ~0.85):
# the cat escalates to resnet50, the espresso and the mug do not.
CASCADE_PHOTOS = {"chelsea": True, "coffee": False, "mug": False}


def test_bench_smoke(server, model_repo, repo_root, tmp_path):
    """bls-bench against the session's server (--url): every point answers, and the cascade
    escalates as many images as the photos it cycled through say it must."""
    images = tmp_path / "images"
    images.mkdir()
    for name in CASCADE_PHOTOS:
        shutil.copy(repo_root / "samples" / f"{name}.jpg", images)
    out = tmp_path / "bench"
    # 3 s a point: on a machine busy with the suite, the cascade's c=2 point made 8 requests in 1.5 s,
    # too few to tell its escalated share (below).
    code = bench.main(["--url", server.grpc_url, "--protocol", "grpc", "--concurrency", "1,2", "--duration", "3",
                       "--warmup", "0.5", "--model-repository", str(model_repo), "--images", str(images),
                       "--targets", "classifier,classify_bls,ensemble_resnet50,cascade@0.5", "--out", str(out)])
    assert code == 0
    report = json.loads((out / "bench.json").read_text())
    points = {(p["target"], p["concurrency"]): p for p in report["points"]}
    assert (set(points)
            == {(t, c) for t in ("classifier", "classify_bls", "ensemble_resnet50", "cascade@0.5") for c in (1, 2)})
    for p in points.values():
        assert p["errors"] == 0 and p["refused_by"] == {} and p["images_per_s"] > 0 and p["p50_ms"] <= p["p99_ms"]
    # Each client cycles through the photos in order (each then its mirror: E E N N N N), so
    # any run of n requests escalates n/3 of them, give or take 4/3 per client. Fractions, so
    # that a run at exactly 4/3 off (n = 6k + 2 from a cycle's start) is not lost to rounding.
    # Over 4 requests per client, neither none nor all escalated passes.
    # An unsure photo is escalated, or answered degraded where resnet50 would have been too late
    # on this busy machine: the two together are the unsure share.
    share = Fraction(sum(CASCADE_PHOTOS.values()), len(CASCADE_PHOTOS))
    for c in (1, 2):
        point = points["cascade@0.5", c]
        n = point["requests"]
        assert n > 4 * c, f"too few requests at concurrency {c} to check the escalated count: {n}"
        unsure = round((point["escalated_fraction"] + (point["degraded_fraction"] or 0)) * n)
        assert (abs(unsure - share * n) <= Fraction(4, 3) * c), (f"{unsure} of {n} unsure at concurrency {c}; expected "
                                                                 f"about {float(share * n):.1f}")
    assert points["classify_bls", 1]["escalated_fraction"] is None
    assert "classify_bls / classifier images/s" in " ".join(report["meta"]["ratios"])
    assert (out / "bench.png").stat().st_size > 10_000
    table = (out / "bench.md").read_text()
    assert "| classify_bls | 1 |" in table and "12MP" in table
    assert all(r["ms_per_image"] > 0 and r["ms_per_image_cold_cache"] > 0 for r in report["preprocess"])


def test_bench_names_a_missing_model_before_it_starts(tmp_path, repo_root, capsys):
    repo = tmp_path / "models"
    shutil.copytree(repo_root / "models", repo,
                    ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data", "*.onnx.json", "__pycache__"))
    with pytest.raises(SystemExit) as exc:
        bench.main(["--concurrency", "1", "--duration", "1", "--warmup", "0", "--model-repository", str(repo),
                    "--targets", "classifier,classify_bls", "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "cannot benchmark without resnet50_onnx" in err
    assert f"{sys.executable} -m engine_build export --model resnet50 --weights random" in err  # works when copied
    assert not (tmp_path / "out").exists()


def test_the_one_model_peer_answers_beside_classify_bls_on_the_same_engine(model_repo, repo_root, tmp_path):
    """bls-bench's classify_peer@MODEL (one python model running MODEL's engine itself) loads
    from its own repository copy and answers every request, beside classify_bls@MODEL."""
    images = tmp_path / "images"
    images.mkdir()
    shutil.copy(repo_root / "samples" / "mug.jpg", images)
    out = tmp_path / "bench"
    engine = "efficientnet_lite0_onnx"
    targets = f"classify_bls@{engine},classify_peer@{engine}"
    # over HTTP: the sweep's other protocol (test_bench_smoke runs gRPC)
    assert bench.main(["--concurrency", "1", "--duration", "1", "--warmup", "0.5", "--model-repository",
                       str(model_repo),
                       "--images", str(images), "--targets", targets, "--protocol", "http", "--out", str(out)]) == 0
    report = json.loads((out / "bench.json").read_text())
    points = {p["target"]: p for p in report["points"]}
    assert set(points) == set(targets.split(","))
    assert all(p["errors"] == 0 and p["requests"] > 0 for p in points.values())
    assert f"classify_bls@{engine} / classify_peer@{engine} images/s at c=1" in report["meta"]["ratios"]


def test_the_overload_mode_measures_a_spike_per_factor_and_the_stop_after_it(model_repo, repo_root, tmp_path):
    """bls-bench --overload on a server of its own, on the ports given, for a few seconds:
    classify_bls as the main job serves it, its capacity, spikes of 2 and 4 x capacity x 0.5 s
    gRPC clients with deadlines (a row each), what the server finished (and for how many gone
    clients), then the stop after it: exit 0."""
    images = tmp_path / "images"
    images.mkdir()
    shutil.copy(repo_root / "samples" / "mug.jpg", images)
    out = tmp_path / "overload"
    ports = [free_port() for _ in range(3)]
    assert bench.main(["--overload", "--targets", "classify_bls_default", "--protocols", "grpc", "--clients",
                       "deadline",
                       "--factor", "2,4", "--capacity-duration", "2", "--spike", "3", "--recovery", "1.5", "--warmup",
                       "0.5",
                       "--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]),
                       "--model-repository", str(model_repo), "--images", str(images), "--out", str(out)]) == 0
    report = json.loads((out / "overload.json").read_text())
    assert report["meta"]["endpoints"] == {"http": f"127.0.0.1:{ports[0]}", "grpc": f"127.0.0.1:{ports[1]}",
                                           "metrics": f"http://127.0.0.1:{ports[2]}/metrics"}
    assert [r["factor"] for r in report["results"]] == [2.0, 4.0]
    for result in report["results"]:
        assert ((result["target"], result["protocol"], result["errors"])
                == ("classify_bls_default", "grpc", 0)), result["error_samples"]
        assert result["timeout_parameter"] is False and 0 <= result["refused_by_queue"] <= result["refused"]
        assert sum(result["refused_by"].values()) == result["refused"]
        assert result["capacity_images_per_s"] > 0 and result["clients"] >= 2
        assert (result["clients"]
                == pytest.approx(max(9, result["factor"] * result["capacity_images_per_s"] * 0.5), abs=1))
        assert result["finished_counted_by"] == 'bls_requests_total{code=~"OK|GONE"}'
        assert result["finished"] > 0 and 0 <= result["finished_for_gone"] <= result["finished"]
        assert 0 < result["in_time_per_s"] and result["goodput_ratio"] == pytest.approx(
            result["in_time_per_s"] / result["capacity_images_per_s"], rel=0.01)
        print(f"\noverload at {result['factor']:g}x: {result['clients']} clients, goodput "
              f"{result['goodput_ratio']:.2f}x, {result['refused']} refused")
    stop = report["meta"]["stop"]
    print(f"stop {stop['seconds']} s, drained {stop['drained']}")
    # Always a full drain: tritonserver exits 0, or Triton 2.51 kept a model from unloading with
    # nothing in flight after the spike's cancelled gRPC calls, and it was killed after the
    # drain (docs/reliability.md, "Stopping bls-serve"): the report says which.
    assert (stop["exit_code"], stop["drained"]) in ((0, True), (-9, True)), stop
    table = (out / "overload.md").read_text()
    assert ("| classify_bls_default | grpc, deadline only | 2 |" in table
            and "| classify_bls_default | grpc, deadline only | 4 |" in table)
    assert (f"The server's stop after the runs (drain, then SIGTERM): {stop['seconds']:.1f} s, tritonserver exit code "
            f"{stop['exit_code']}" in table)


def test_the_open_loop_counts_what_a_running_servers_flow_answered(server, repo_root, model_repo, tmp_path):
    """bls-bench --open-loop on a running server (--host and its ports, over HTTP): capacity,
    then Poisson arrivals at 0.3x of it with 2 s deadlines, the files as given: a photo, a file
    that is no image and a 12-megapixel JPEG. What the server finished is the flow's own count
    from the metrics port, so the no-image requests, which classify_bls answers with a 400 and
    Triton's success count counts, are not in it."""
    images = tmp_path / "images"
    images.mkdir()
    shutil.copy(repo_root / "samples" / "mug.jpg", images)
    (images / "broken.jpg").write_bytes(b"not a jpeg")
    out = tmp_path / "open"
    opts = server.options
    assert bench.main(["--open-loop", "0.3", "--targets", "classify_bls", "--protocols", "http", "--host", "127.0.0.1",
                       "--http-port", str(opts.http_port), "--grpc-port", str(opts.grpc_port), "--metrics-port",
                       str(opts.metrics_port),
                       "--image-size", "original", "--heavy-images", "1", "--capacity-clients", "2",
                       "--capacity-duration", "1.5",
                       "--duration", "2", "--warmup", "0.5", "--model-repository", str(model_repo), "--images",
                       str(images), "--out", str(out)]) == 0
    report = json.loads((out / "openloop.json").read_text())
    (row,) = report["results"]
    print(f"\nopen loop at 0.3x of {row['capacity_per_s']:.1f}/s: {row['sent']} sent, {row['answered']} answered, "
          f"{row['errors']} errors, {row['refused']} refused, {row['deadlines_passed']} gone; finished "
          f"{row['finished']}; {row['late_sends']} sent late")
    assert (row["target"], row["protocol"], row["load"], row["deadline_s"]) == ("classify_bls", "http", 0.3, 2.0)
    assert row["sent"] == row["answered"] + row["refused"] + row["deadlines_passed"] + row["errors"]
    assert row["answered"] > 0 and row["errors"] > 0, row["error_samples"]  # the no-image file: a 400 each
    assert all("400" in e for e in row["error_samples"]), row["error_samples"]
    assert row["finished_counted_by"] == 'bls_requests_total{code=~"OK|GONE"}'
    # the flow's count: its answers, not its 400s (Triton's success count has both)
    assert row["answered"] <= row["finished"] <= row["answered"] + row["deadlines_passed"]
    notes = report["meta"]["image_notes"]
    assert (notes[0] == "broken.jpg: 0 KB, not an image Pillow reads: sent as given"
            and notes[1].startswith("mug.jpg: 800x600 JPEG"))
    assert notes[2].startswith("heavy 1: 4000x3000 JPEG")
    table = (out / "openloop.md").read_text()
    assert "| classify_bls | http, deadline only | 0.3x |" in table and "as given (--image-size original)" in table


def test_a_running_servers_flow_counts_are_read_or_the_run_stops(server, model_repo, repo_root, tmp_path, capsys):
    """--url with a metrics port where nothing answers: bls-bench stops before any load, naming
    the URL and the option, rather than count answers with Triton's success count."""
    images = tmp_path / "images"
    images.mkdir()
    shutil.copy(repo_root / "samples" / "mug.jpg", images)
    nowhere = free_port()
    with pytest.raises(SystemExit) as exc:
        bench.main(["--open-loop", "0.5", "--targets", "classify_bls", "--protocols", "grpc", "--url", server.grpc_url,
                    "--metrics-port", str(nowhere), "--model-repository", str(model_repo), "--images", str(images),
                    "--out", str(tmp_path / "out")])
    assert f"cannot read the server's metrics at http://127.0.0.1:{nowhere}/metrics" in str(exc.value)
    assert "--metrics-port" in str(exc.value) and not (tmp_path / "out").exists()
