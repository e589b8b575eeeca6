"""The plan as the runtime reads it (engine/runtime/plan.py): typed, versioned, checked
field by field when run.json is read, the same from the planner to the runtime."""
import json

import pytest

from engine.planning.planner import make_plan
from engine.project import load_project
from engine.runtime.plan import PARTIAL, REPLICATE, Layout, PlanError, RunPlan, TPEntry, shard

from test_dist_equivalence import EXAMPLES, TRANSFORMER_SP


def test_layouts_are_values_with_their_dtensor_and_oneflow_names():
    assert str(shard(-1)) == "Shard(-1)" and shard(-1).oneflow == "split(-1)" and shard(1).is_shard
    assert str(REPLICATE) == "Replicate()" and REPLICATE.oneflow == "broadcast"
    assert str(PARTIAL) == "Partial()" and PARTIAL.oneflow == "partial_sum"
    for lay in (shard(0), shard(-1), REPLICATE, PARTIAL):
        assert Layout.parse(str(lay)) == lay
    with pytest.raises(PlanError, match=r"plan.tp_plan.fc1.input: 'Shard\(x\)' is not a layout"):
        Layout.parse("Shard(x)", "plan.tp_plan.fc1.input")


def test_the_planners_plan_round_trips_through_run_json_typed():
    project = load_project(EXAMPLES / "transformer_synthetic.lflow")
    plan = make_plan(project, 4, placement={"pp": 2, "tp": 2, "microbatches": 2}, styles=TRANSFORMER_SP)
    assert plan.ok, plan.errors
    typed = plan.run_plan()
    assert (typed.pp, typed.dp, typed.tp, typed.world, typed.microbatches) == (2, 1, 2, 4, 2)
    assert all(isinstance(e, TPEntry) and isinstance(e.input, Layout) for e in typed.tp_plan.values())
    norms = [e for e in typed.tp_plan.values() if e.style == "sequence"]
    assert norms and all(e.output == shard(1) for e in norms)
    as_json = json.loads(json.dumps(plan.runtime_plan()))  # what run.json holds
    assert as_json["version"] == 1 and as_json["tp_plan"] == plan.doc["tp_plan"]
    assert RunPlan.from_json(as_json) == typed


@pytest.mark.parametrize("change, message", [
    ({"pp": 0}, "run.json plan.pp: 0 is not an integer >= 1"),
    ({"schedule": "zigzag"}, "run.json plan.schedule: 'zigzag' is not one of gpipe, 1f1b, interleaved1f1b"),
    ({"tp_plan": {"fc1": {"style": "diagonal"}}}, "run.json plan.tp_plan.fc1.style: 'diagonal' is not one of"),
    ({"tp_plan": {"fc1": {"style": "colwise", "output": "Shard(-1"}}}, "run.json plan.tp_plan.fc1.output"),
    ({"stages": [["fc1"], "fc2"]}, r"run.json plan.stages\[1\]: expected a list of node ids"),
    ({"version": 9}, "run.json plan.version: 9; this runtime reads plans up to version 1"),
    ({"colour": "red"}, "run.json plan: unknown field 'colour'"),
    ({"pp": 3, "stages": [["a"], ["b"]]}, "run.json plan.stages: 2 stage\\(s\\) for pp=3"),
])
def test_a_bad_plan_names_its_field(change, message):
    good = RunPlan(pp=2, stages=[["fc1"], ["fc2"]]).to_json()
    with pytest.raises(PlanError, match=message):
        RunPlan.from_json({**good, **change})


def test_an_older_plan_without_a_version_still_reads():
    old = {"pp": 1, "dp": 2, "tp": 1, "data_parallel": "fsdp", "schedule": "1f1b", "microbatches": 1,
           "reshard_after_forward": True, "mixed_precision": "none", "tp_plan": {}, "checkpoint": [],
           "predicted": {"step_s": 0.01}}
    plan = RunPlan.from_json(old)
    assert (plan.dp, plan.data_parallel, plan.version) == (2, "fsdp", 1)


def test_each_rank_runs_the_stages_its_schedule_gives_it():
    """rank_stages answers without scanning every stage, and agrees with stage_rank: looped
    schedules put stage s on rank s % pp, the V-shaped ones go down the ranks and back up."""
    from engine.runtime.plan import SCHEDULES, rank_stages, stage_rank

    for schedule in SCHEDULES:
        for pp in (1, 2, 3, 4):
            for n in (pp, 2 * pp, 3 * pp):
                for r in range(pp):
                    assert rank_stages(schedule, pp, n, r) == [s for s in range(n) if stage_rank(schedule, pp, s) == r]
    assert rank_stages("zbv", 4, 8, 0) == [0, 7] and rank_stages("zbv", 4, 8, 3) == [3, 4]
    assert rank_stages("interleaved1f1b", 4, 8, 0) == [0, 4]
    assert rank_stages("1f1b", 65_536, 65_536, 65_535) == [65_535]
