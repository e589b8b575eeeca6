"""engine/runs/tail.py: records read by byte offset, parsed as json.loads would."""
from __future__ import annotations

import json
import math

import pytest

from engine.runs import tail
from engine.runs.tail import MetricsTail, parse_jsonl


def _same(a: list[dict], b: list[dict]) -> bool:
    """Equal, with NaN equal to NaN."""
    def norm(v):
        return "nan" if isinstance(v, float) and math.isnan(v) else v
    return [{k: norm(v) for k, v in r.items()} for r in a] == [{k: norm(v) for k, v in r.items()} for r in b]


def _reference(lines: list[bytes]) -> list[dict]:
    out = []
    for ln in lines:
        try:
            obj = json.loads(ln.decode("utf-8", errors="replace"))
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


GOOD = [json.dumps({"step": i, "time": i * 0.01, "loss": 1.0 / (i + 1), "lr": 1e-3}).encode() for i in range(200)]


@pytest.mark.parametrize("odd", [
    None,
    json.dumps({"step": 7, "loss": float("nan")}).encode(),  # Python's json writes NaN; orjson refuses it
    json.dumps({"step": 8, "loss": float("inf")}).encode(),
    b'{"step": 9, "loss": 0.5',  # torn
    b"",  # blank
    b"   ",
    b"[1, 2]",  # not an object
    b"1, 2",  # two values: skipped as json.loads skips it
    b'{"a": 1}, {"b": 2}',
    b'{"event": "end", "note": "caf\xc3\xa9"}',
    b'{"event": "bad utf-8 \xff"}',
])
def test_parse_jsonl_reads_what_json_reads(odd):
    lines = GOOD[:100] + ([odd] if odd is not None else []) + GOOD[100:]
    got = parse_jsonl(lines)
    assert _same(got, _reference(lines))
    assert len(got) >= 200


def test_integers_beyond_64_bits_come_as_floats():
    got = parse_jsonl(GOOD[:2] + [b'{"step": 123456789012345678901234567890}'])
    assert got[:2] == _reference(GOOD[:2])
    assert got[2]["step"] == pytest.approx(1.2345678901234568e29)


def test_parse_jsonl_without_orjson(monkeypatch):
    monkeypatch.setattr(tail, "orjson", None)
    lines = GOOD[:3] + [json.dumps({"step": 4, "loss": float("nan")}).encode(), b"oops"]
    assert _same(parse_jsonl(lines), _reference(lines))
    assert _same(parse_jsonl([ln.decode() for ln in lines]), _reference(lines))


def test_metrics_tail_follows_by_offset(tmp_path):
    path = tmp_path / "metrics.jsonl"
    t = MetricsTail(path)
    assert t.poll_records() == []
    path.write_bytes(b"\n".join(GOOD[:5]) + b"\n" + GOOD[5][:10])  # the last line half written
    assert t.poll_records() == _reference(GOOD[:5])
    with open(path, "ab") as f:
        f.write(GOOD[5][10:] + b"\n" + GOOD[6] + b"\n")
    assert t.poll_records() == _reference(GOOD[5:7])
    assert t.poll_records() == []
    path.write_bytes(GOOD[0] + b"\n")  # replaced by a shorter file (a restarted run): from the start
    assert t.poll_records() == _reference(GOOD[:1])


def test_a_run_longer_than_one_poll_is_read_whole(tmp_path):
    """A live poll reads at most 16 MiB (the rest at the next); reading a run whole
    (its summary, the dashboard opening it from the history) gets every line."""
    path = tmp_path / "metrics.jsonl"
    line = json.dumps({"step": 0, "time": 0.0, "loss": 1.0, "pad": "x" * 200})
    n = (17 << 20) // len(line) + 1
    path.write_text((line + "\n") * n)
    assert len(tail.read_metrics(path)) == n
    t = MetricsTail(path)
    assert len(t.poll_data(max_bytes=None).split(b"\n")) == n and t.offset == path.stat().st_size
    live = MetricsTail(path)
    first = live.poll_lines()
    assert 0 < len(first) < n and len(first) + len(live.poll_lines()) == n  # the rest at the next poll
