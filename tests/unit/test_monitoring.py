"""deploy/monitoring/ against the real Prometheus tools (Debian's `prometheus` package gives
promtool; .ci/run installs it): the rules load, each alert fires and stays quiet where
rules_test.yml says, the scrape config loads them, and every series the rules and the
dashboard read is one the project exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from bls_pipeline.adapter import metrics
from bls_pipeline.serve import status

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None,
                                    reason="promtool is not installed (Debian: apt-get install prometheus; .ci/run "
                                           "does)")
# Triton's own series the rules or the dashboard may read.
TRITON_SERIES = {"nv_inference_request_success", "nv_inference_request_failure", "nv_inference_queue_duration_us",
                 "nv_inference_request_summary_us", "nv_inference_queue_summary_us",
                 # nv_inference_pending_request_count, _count taken off as for a histogram
                 "nv_inference_pending_request"}


def _promtool(*args: str, cwd: Path = MONITORING) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@needs_promtool
def test_the_rules_load():
    done = _promtool("check", "rules", "rules.yml")
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_each_alert_fires_and_stays_quiet_where_the_rule_tests_say():
    done = _promtool("test", "rules", "rules_test.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    tested = set(re.findall(r"alertname: (\w+)", (MONITORING / "rules_test.yml").read_text()))
    alerts = set(re.findall(r"- alert: (\w+)", (MONITORING / "rules.yml").read_text()))
    assert alerts and tested == alerts  # every alert has its cases


@needs_promtool
def test_the_rule_tests_catch_a_rule_that_does_not_fire(tmp_path):
    """The rule tests can fail: with the broken-flow alert's threshold raised, its case fails."""
    shutil.copy(MONITORING / "rules_test.yml", tmp_path)
    rules = (MONITORING / "rules.yml").read_text()
    broken = rules.replace('increase(bls_requests_total{code="INTERNAL"}[5m])) > 0',
                           'increase(bls_requests_total{code="INTERNAL"}[5m])) > 5')
    assert broken != rules
    (tmp_path / "rules.yml").write_text(broken)
    done = _promtool("test", "rules", "rules_test.yml", cwd=tmp_path)
    assert done.returncode != 0 and "BLSFlowBroken" in done.stdout + done.stderr


@needs_promtool
def test_the_rule_tests_catch_cancellations_counted_as_refusals(tmp_path):
    """Counted as refusals (Triton's CANCELED beside its REJECTED), the impatient clients'
    cancellations page for overload and low availability: their case fails."""
    shutil.copy(MONITORING / "rules_test.yml", tmp_path)
    rules = (MONITORING / "rules.yml").read_text()
    broken = rules.replace('nv_inference_request_failure{reason="REJECTED"}',
                           'nv_inference_request_failure{reason=~"REJECTED|CANCELED"}')
    assert broken != rules
    (tmp_path / "rules.yml").write_text(broken)
    done = _promtool("test", "rules", "rules_test.yml", cwd=tmp_path)
    out = done.stdout + done.stderr
    assert (done.returncode != 0
            and "impatient clients and a busy closed loop leave BLSOverloaded and BLSAvailabilityLow quiet" in out), out


@needs_promtool
def test_the_scrape_config_loads_with_its_rules():
    done = _promtool("check", "config", "prometheus.yml")
    assert done.returncode == 0, done.stdout + done.stderr


def _run_prometheus(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(MONITORING / "run-prometheus.sh"), *args], capture_output=True, text=True, timeout=60)


@needs_promtool
def test_run_prometheus_writes_the_scrape_config_for_other_ports(tmp_path):
    """bls-serve on other ports: the script's config scrapes those, loads the rules from
    anywhere, and promtool takes it (tests/integration/test_prometheus.py runs Prometheus with it)."""
    done = _run_prometheus("--metrics-port", "9102", "--status-port", "9103", "--interval", "1s", "--print-config")
    assert done.returncode == 0, done.stderr
    config = done.stdout
    assert '- targets: ["127.0.0.1:9102"]' in config and '- targets: ["127.0.0.1:9103"]' in config
    assert "8002" not in config.split("global:")[1] and "8003" not in config.split("global:")[1]
    assert f"  - {MONITORING / 'rules.yml'}\n" in config and "scrape_interval: 1s" in config
    (tmp_path / "prometheus.yml").write_text(config)
    checked = _promtool("check", "config", str(tmp_path / "prometheus.yml"), cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert '"[::1]:9102"' in _run_prometheus("--host", "::1", "--metrics-port", "9102", "--print-config").stdout


@pytest.mark.parametrize(("args", "says"), [
    (("--metrics-port", "80o2"), "--metrics-port 80o2: a port number 1..65535"),
    (("--status-port", "70000"), "--status-port 70000: a port number 1..65535"),
    (("--interval", "5"), "--interval 5: a Prometheus duration such as 1s, 15s, 1m"),
    (("--metric-port", "9002"), "unknown argument --metric-port"),
])
def test_run_prometheus_names_a_bad_flag(args, says):
    done = _run_prometheus(*args, "--print-config")
    assert done.returncode == 2 and says in done.stderr and done.stdout == ""


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads((MONITORING / "dashboard.json").read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


@needs_promtool
def test_every_dashboard_query_is_promql(tmp_path):
    """Each panel's query, its Grafana variable filled in, loads as a recording rule."""
    exprs = _dashboard_exprs()
    assert len(exprs) >= 10
    rules = {"groups": [{"name": "dashboard",
                         "rules": [{"record": f"dashboard:panel_{i}", "expr": e.replace("$model", ".*")}
                                   for i, e in enumerate(exprs)]}]}
    (tmp_path / "dashboard_rules.yml").write_text(json.dumps(rules))  # JSON is YAML
    done = _promtool("check", "rules", "dashboard_rules.yml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def _exported() -> set[str]:
    """What the project exports: the flows' families, their restarts gauge, bls-serve's status port's."""
    return {name for name, _ in metrics._FAMILIES.values()} | {"bls_server_restarts"} | set(status._HELP)


def test_the_rules_and_the_dashboard_read_only_series_that_exist():
    recorded = set(re.findall(r"record: ([\w:]+)", (MONITORING / "rules.yml").read_text()))
    text = (MONITORING / "rules.yml").read_text() + "\n".join(_dashboard_exprs())
    used = {re.sub(r"_(bucket|sum|count)$", "", name) for name in re.findall(r"\b((?:bls|nv)_[a-z_]+)\b", text)}
    unknown = used - _exported() - TRITON_SERIES
    assert unknown == set()
    assert {name for name in re.findall(r"\b(bls:[\w:]+)", "\n".join(_dashboard_exprs()))} <= recorded
