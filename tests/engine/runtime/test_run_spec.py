"""The run spec (engine/runtime/spec.py) and its one builder (engine/runs/build.py build_run)."""
import json

import pytest

import engine.runs.build as run_module
from engine.diagram.graph import Graph
from engine.project import Project, Training
from engine.runs.build import RunError, build_run, replan_run
from engine.runtime.spec import SPEC_VERSION, RunSpec, SpecError


def mlp(steps=4) -> Project:
    g = Graph()
    g.add_node("Input", {"shape": [16]}, id="x")
    g.add_node("Linear", {"out_features": 32}, id="fc1")
    g.add_node("ReLU", {}, id="act")
    g.add_node("Linear", {"out_features": 4}, id="fc2")
    g.add_node("Output", {"loss": "cross_entropy"}, id="out")
    for a, b in [("x", "fc1"), ("fc1", "act"), ("act", "fc2"), ("fc2", "out")]:
        g.connect(a, "out", b, "in")
    tr = Training.model_validate({"dataset": {"kind": "synthetic_classification", "n_samples": 256, "n_features": 16,
                                              "n_classes": 4}, "batch_size": 32, "steps": steps})
    return Project(g, name="mlp", training=tr)


def test_one_process_gets_a_plan_of_one_and_a_prediction(tmp_path):
    built = build_run(mlp(), tmp_path / "r")
    spec = RunSpec.load(built.run_dir)
    assert spec.version == SPEC_VERSION and built.nproc == spec.world == 1 and not spec.distributed
    assert (spec.plan.pp, spec.plan.dp, spec.plan.tp) == (1, 1, 1)
    assert spec.predicted.step_s and spec.predicted.step_s > 0 and spec.predicted.device
    assert spec.data.n_train + spec.data.n_val == 256 and spec.data.n_classes == 4
    doc = json.loads((built.run_dir / "run.json").read_text())
    assert "placement" not in doc and "predicted_step_s" not in doc  # the layout lives in the plan only


def test_the_diagram_is_compiled_and_planned_once(tmp_path, monkeypatch):
    import engine.planning.planner as planner

    calls = {"compile": 0, "plan": 0}
    real_compile, real_plan = run_module.compile_graph, planner.make_plan

    def counting_compile(*a, **kw):
        calls["compile"] += 1
        return real_compile(*a, **kw)

    def counting_plan(*a, **kw):
        calls["plan"] += 1
        return real_plan(*a, **kw)

    monkeypatch.setattr(run_module, "compile_graph", counting_compile)
    monkeypatch.setattr(planner, "make_plan", counting_plan)
    built = build_run(mlp(), tmp_path / "r", nproc=2)
    assert calls == {"compile": 1, "plan": 1}
    assert built.spec.plan.dp == 2 and built.nproc == 2  # nproc alone: data parallel over it


def test_overrides_are_checked_before_anything_is_written(tmp_path):
    with pytest.raises(RunError, match="placement.schedule"):
        build_run(mlp(), tmp_path / "a", placement={"pp": 2, "schedule": "nonsense"})
    with pytest.raises(RunError, match="nproc 3 but the placement needs pp\\*dp\\*tp = 1\\*2\\*1 = 2"):
        build_run(mlp(), tmp_path / "b", nproc=3, placement={"dp": 2})
    with pytest.raises(RunError, match="steps must be a whole number"):
        build_run(mlp(), tmp_path / "c", steps=0)
    assert not any((tmp_path / d).exists() for d in "abc")


def test_a_new_layout_for_a_resume_is_planned_into_the_spec(tmp_path):
    rd = build_run(mlp(), tmp_path / "r").run_dir
    replan_run(rd, 2, {})
    spec = RunSpec.load(rd)
    assert (spec.plan.pp, spec.plan.dp, spec.plan.tp) == (1, 2, 1) and spec.predicted.nproc == 2


def test_a_version_1_run_json_reads_as_the_same_spec(tmp_path):
    rd = build_run(mlp(), tmp_path / "r").run_dir
    doc = json.loads((rd / "run.json").read_text())
    v1 = {k: v for k, v in doc.items() if k not in ("version", "predicted")}
    v1.update(plan=None, placement={"pp": 1, "dp": 3, "tp": 1, "mixed_precision": "bf16"}, predicted_step_s=0.01,
              predicted_device="cpu", nproc=3)
    spec = RunSpec.from_json(v1)
    assert spec.world == 3 and spec.plan.mixed_precision == "bf16"
    assert (spec.predicted.step_s, spec.predicted.device, spec.predicted.nproc) == (0.01, "cpu", 3)


@pytest.mark.parametrize("change, message", [
    (lambda d: d["training"].update(batch_size=0), "run.json training.batch_size: 0 is not an integer >= 1"),
    (lambda d: d["training"]["optimizer"].update(name="lion"), "run.json training.optimizer.name: 'lion'"),
    (lambda d: d.update(total_steps="many"), "run.json total_steps: 'many' is not an integer"),
    (lambda d: d["data"].update(path="../../etc/passwd"), "run.json data.path: '../../etc/passwd' is not inside"),
    (lambda d: d.update(version=99), "run.json version: 99; this runtime reads run specs up to version"),
    (lambda d: d.update(colour="red"), "run.json: unknown field 'colour'"),
])
def test_a_bad_field_is_named(tmp_path, change, message):
    rd = build_run(mlp(), tmp_path / "r").run_dir
    doc = json.loads((rd / "run.json").read_text())
    change(doc)
    (rd / "run.json").write_text(json.dumps(doc))
    with pytest.raises(SpecError) as err:
        RunSpec.load(rd)
    assert message in str(err.value)
