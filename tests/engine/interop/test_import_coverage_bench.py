"""bench/import_coverage.py, the README's coverage table, kept from rotting: one row of it
measured here (BERT, one-process training), every cell filled by a measurement."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_coverage_bench_measures_a_row():
    spec = importlib.util.spec_from_file_location("import_coverage", ROOT / "bench" / "import_coverage.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    row = bench.row("BERT", steps=2, dist=False)
    assert len(row) == len(bench.HEADERS) and row[0] == "BERT"
    assert row[1] == "ok" and row[2].startswith("ok (") and row[3] == "exact (5,827)" and row[4] == "ok"
    assert row[5].startswith("ok (") and row[6].startswith("ok (loss ")
    assert row[7:] == ["not run", "not run"]
