"""The run folder's typed records (engine/runtime/records.py): status.json as RunStatus,
logs/rank{R}.error as RankError; lenient with what older (or other) versions wrote."""
from __future__ import annotations

import json

from engine.runtime.records import RankError, RunStatus
from engine.runs.history import summarize_run


def test_a_status_round_trips_and_keeps_fields_it_does_not_know(tmp_path):
    st = RunStatus("failed", 12, 40, 4242, 100.0, 160.5, "rank 1: ValueError: x", failed_rank=1,
                   failure="ValueError: x", extra={"written_by": "a later Layerflow"})
    d = st.to_json()
    assert d["written_by"] == "a later Layerflow" and d["failed_rank"] == 1 and st.done
    (tmp_path / "status.json").write_text(json.dumps(d))
    assert RunStatus.read(tmp_path) == st
    assert "failed_rank" not in RunStatus("running").to_json()  # written only once known


def test_older_and_odd_status_files_read_as_defaults(tmp_path):
    assert RunStatus.read(tmp_path) is None  # none yet
    (tmp_path / "status.json").write_text('{"state": "runn')  # being written
    assert RunStatus.read(tmp_path) is None
    (tmp_path / "status.json").write_text(json.dumps({"state": "succeeded", "step": "12", "total_steps": True,
                                                      "started": "2026-01-02T03:04:05Z", "error": 3}))
    st = RunStatus.read(tmp_path)
    assert (st.state, st.step, st.total_steps, st.error) == ("succeeded", 0, None, None)
    assert st.started == 1767323045.0  # ISO-8601 text as epoch seconds
    assert RunStatus.from_json([1, 2]) == RunStatus()


def test_the_run_list_reads_the_record(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"name": "r", "total_steps": 30}))
    (tmp_path / "status.json").write_text(json.dumps(RunStatus("cancelled", 7, None, None, 10.0, 12.0).to_json()))
    s = summarize_run(tmp_path)
    assert (s.state, s.step, s.total_steps, s.duration) == ("cancelled", 7, 30, 2.0)


def test_rank_errors_parse_json_or_an_old_literal_and_nothing_else():
    assert RankError.parse(json.dumps(RankError(3, 1.5, "E: x").to_json())) == RankError(3, 1.5, "E: x")
    assert RankError.parse(repr({"rank": 0, "time": 5, "error": "E"})) == RankError(0, 5.0, "E")
    for bad in ("__import__('os').system('false')", '{"rank": "0", "time": 1, "error": "E"}',
                '{"rank": 0, "time": true, "error": "E"}', "[1, 2]", ""):
        assert RankError.parse(bad) is None, bad
