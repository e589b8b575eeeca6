"""Property: however a project file is mangled, loading, validating, summarising and
planning it ends in a result or one clear error; it never raises anything else, never
imports code, and ends quickly."""
from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.diagram.compile import compile_graph
from engine.planning.planner import make_plan
from engine.project import ProjectError, loads_project

from test_project import _paths

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "resources" / "examples").glob("*.lflow"))
TEXTS = [p.read_text() for p in EXAMPLES]

hostile = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2 ** 70, max_value=2 ** 70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
    | st.sampled_from(["Custom", "Op", "shutil:rmtree", "os:_exit", "class", "fc1\n", "aten.from_file.default",
                       "/dev/zero", "../../etc/passwd", "in", "out", 2 ** 63, -1, 10 ** 30]),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12)


def _replace(obj, path, value):
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(obj, dict):
        return {**obj, head: _replace(obj[head], rest, value)}
    out = list(obj)
    out[head] = _replace(out[head], rest, value)
    return out


@settings(max_examples=150, deadline=10_000, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.integers(0, len(TEXTS) - 1), st.lists(st.tuples(st.integers(0, 10 ** 6), hostile), min_size=1, max_size=3))
def test_mangled_projects_give_results_or_clear_errors(monkeypatch_free_import_guard, which, edits):
    data = json.loads(TEXTS[which])
    for pick, value in edits:
        paths = list(_paths(data))
        data = _replace(data, paths[pick % len(paths)], value)
    text = json.dumps(data, allow_nan=True)
    try:
        project = loads_project(text, "fuzz.lflow")
    except ProjectError as exc:
        assert str(exc) and len(str(exc)) < 20_000
        return
    result = compile_graph(project.graph)
    assert len("\n".join(map(str, result.errors))) < 200_000
    rows = result.summary_rows()
    assert all(isinstance(r["params"], int) for r in rows)
    if result.ok:
        plan = make_plan(project, 1)
        assert plan.ok or plan.errors


import pytest  # noqa: E402


@pytest.fixture
def monkeypatch_free_import_guard(monkeypatch):
    """Any import of a Custom path during the property fails the test."""
    from engine.runtime import layers

    def refuse(path):
        raise AssertionError(f"project code was imported: {path}")

    monkeypatch.setattr(layers, "import_object", refuse)
    yield
