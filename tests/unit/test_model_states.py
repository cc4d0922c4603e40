"""The model states bls-serve keeps for its flows (runtime/load/states_file.py): which loads failed."""

from __future__ import annotations

import json

from bls_pipeline.runtime.load.states_file import failed_loads, reader


def test_only_a_load_that_failed_is_a_failure():
    states = {"broken": {"state": "UNAVAILABLE", "reason": "Internal: InvalidProtobuf"},
              "gone": {"state": "UNAVAILABLE", "reason": "unloaded"}, "ok": {"state": "READY", "reason": ""},
              "coming": {"state": "LOADING", "reason": ""}, "never": {"state": "UNAVAILABLE"}}
    assert failed_loads(json.dumps(states)) == {"broken": "Internal: InvalidProtobuf"}


def test_a_file_half_written_or_absent_knows_no_failure(tmp_path):
    assert failed_loads('{"broken": {"state": "UNAV') == {}
    assert reader(tmp_path / "absent.json")() == {}
    assert reader(None)() == {}


def test_the_reader_reads_the_file_anew_each_time(tmp_path):
    path = tmp_path / "states.json"
    read = reader(path)
    path.write_text(json.dumps({"m": {"state": "UNAVAILABLE", "reason": "bad"}}))
    assert read() == {"m": "bad"}
    path.write_text(json.dumps({"m": {"state": "READY", "reason": ""}}))
    assert read() == {}
