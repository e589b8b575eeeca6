"""The planner chooses memory savings (issue 47, item 3): where a layout does not fit the
device memory given, selective activation checkpointing (the nodes that free most bytes per
recomputed FLOP), then FSDP2's CPU offload, before the layout is refused; what it chose and
what it costs per step are in the plan; placement.memory_savings "off" and a node's own
checkpoint flag (always) override it. The distributed runs of such plans:
tests/engine/test_memory_choice_dist.py."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from engine.autoplace import auto_place
from engine.compile import compile_graph
from engine.cost import activation_bytes, local_cpu
from engine.planner import format_plan, make_plan
from engine.project import load_project, save_project
from engine.runtime.plan import PlanError, RunPlan

EXAMPLES = Path(__file__).resolve().parents[2] / "resources" / "examples"


def proj(name: str):
    return load_project(EXAMPLES / f"{name}.lflow")


def dev_below(plan, frac: float = 1.0, less: int = 0):
    peak = plan.predicted.peak_bytes_max
    return replace(plan.device, memory_bytes=int(peak * frac) - less)


def test_a_layout_that_does_not_fit_gets_checkpointing_chosen_greedily_and_says_so():
    p = proj("transformer_synthetic")
    plain = make_plan(p, 2, placement=p.placement.derive(dp=2))
    assert plain.ok and plain.memory_savings is None and plain.run.checkpoint == []
    small = dev_below(plain, 0.8)
    plan = make_plan(p, 2, small, placement=p.placement.derive(dp=2))
    ms = plan.memory_savings
    assert plan.ok, plan.errors
    assert ms.checkpoint and not ms.cpu_offload and ms.user_checkpoint == [] and ms.fits
    assert plan.run.checkpoint == ms.checkpoint  # what the ranks run
    assert all(d.memory.total_bytes <= small.memory_bytes for d in plan.devices)
    assert ms.freed_bytes == plain.predicted.peak_bytes_max - plan.predicted.peak_bytes_max > 0
    # greedy and minimal: without its last choice the layout would not fit
    c = compile_graph(p.graph)
    freed = {n: activation_bytes(c, [n], {}, 1, 16, 1, 1, 0, "1f1b", set()) for n in ms.checkpoint}
    assert plain.predicted.peak_bytes_max - sum(freed.values()) == plan.predicted.peak_bytes_max
    last = min(ms.checkpoint, key=lambda n: freed[n] / max(1.0, c.nodes[n].flops))
    assert plan.predicted.peak_bytes_max + freed[last] > small.memory_bytes
    # its cost: the checkpointed nodes' forward once more, priced on the plan's device
    want = sum(c.nodes[n].flops for n in ms.checkpoint) * 16
    assert ms.recompute_flops == pytest.approx(want)
    assert ms.recompute_s == pytest.approx(want / small.flops_per_s)
    assert plan.devices[0].flops_per_step == pytest.approx(plain.devices[0].flops_per_step + want)
    text = format_plan(plan)
    assert "memory savings chosen by the planner" in text and "activation checkpointing on" in text
    doc = json.loads(plan.to_json())
    assert doc["memory_savings"]["checkpoint"] == ms.checkpoint and doc["cpu_offload"] is False
    assert doc["checkpoint"] == ms.checkpoint


def test_memory_savings_off_refuses_as_before_and_a_node_flag_always_checkpoints():
    p = proj("transformer_synthetic")
    plain = make_plan(p, 2, placement=p.placement.derive(dp=2))
    small = dev_below(plain, 0.8)
    off = make_plan(p, 2, small, placement=p.placement.derive(dp=2, memory_savings="off"))
    assert not off.ok and "raise pp or tp" in off.errors[0] and off.memory_savings is None
    assert off.run.checkpoint == []
    p.graph.set_placement("attn", checkpoint=True)
    forced = make_plan(p, 2, placement=p.placement.derive(dp=2, memory_savings="off"))
    assert forced.ok and forced.run.checkpoint == ["attn"] and forced.memory_savings is None
    assert "activation checkpointing set on the nodes (always): attn" in format_plan(forced)
    both = make_plan(p, 2, small, placement=p.placement.derive(dp=2))
    assert both.ok and both.memory_savings.user_checkpoint == ["attn"] and "attn" not in both.memory_savings.checkpoint
    assert "attn" in both.run.checkpoint and set(both.memory_savings.checkpoint) <= set(both.run.checkpoint)


def test_fsdp_offloads_to_the_host_when_checkpointing_is_not_enough():
    p = proj("mlp_digits")
    base = p.placement.derive(dp=2, data_parallel="fsdp")
    plain = make_plan(p, 2, placement=base)
    state = plain.devices[0].memory.state_bytes
    tiny = replace(plain.device, memory_bytes=state // 2)  # not even the state fits
    plan = make_plan(p, 2, tiny, placement=base)
    ms = plan.memory_savings
    assert plan.ok, plan.errors
    assert ms.cpu_offload and plan.run.cpu_offload
    for d in plan.devices:
        assert d.memory.offloaded and d.memory.host_bytes == d.memory.state_bytes
        assert d.memory.total_bytes == d.memory.activations_bytes <= tiny.memory_bytes
        # the state itself is what the ranks hold (exact, as without offload)
        assert d.memory.params_bytes == plain.devices[d.rank].memory.params_bytes
    m = plan.devices[0].memory
    assert ms.offload_s == pytest.approx((m.params_bytes + m.grads_bytes) / tiny.host_bytes_per_s)
    assert plan.predicted.comm_s == pytest.approx(plain.predicted.comm_s + ms.offload_s)
    assert "FSDP CPU offload" in format_plan(plan) and plan.doc["cpu_offload"] is True
    # DDP cannot offload: the same device refuses it, saying what was tried
    ddp = make_plan(p, 2, tiny, placement=base.derive(data_parallel="ddp"))
    assert not ddp.ok and not ddp.run.cpu_offload
    assert "even with activation checkpointing" in ddp.errors[0] or "raise pp or tp" in ddp.errors[0]


def test_auto_place_chooses_checkpointing_before_a_harder_layout():
    p = proj("transformer_synthetic")
    ddp2 = make_plan(p, 2, placement={"dp": 2}).predicted.peak_bytes_max
    small = replace(local_cpu(), memory_bytes=ddp2 - 1)
    a = auto_place(p, 2, small)
    assert a.plan.ok and a.plan.memory_savings is not None and a.plan.memory_savings.checkpoint
    assert any("memory savings chosen by the planner" in r for r in a.reasons)
    assert all(d.memory.total_bytes <= small.memory_bytes for d in a.plan.devices)


def test_run_plan_reads_cpu_offload_and_names_the_field():
    r = RunPlan(dp=2, data_parallel="fsdp", cpu_offload=True)
    assert RunPlan.from_json(r.to_json()).cpu_offload is True
    assert RunPlan.from_json(RunPlan().to_json()).cpu_offload is False
    assert RunPlan.from_json({"pp": 1}).cpu_offload is False  # plans written before the field
    with pytest.raises(PlanError, match=r"plan\.cpu_offload: 'yes' is not true or false"):
        RunPlan.from_json({**r.to_json(), "cpu_offload": "yes"})
    with pytest.raises(PlanError, match=r"cpu_offload: true needs data_parallel fsdp"):
        RunPlan.from_json({**r.to_json(), "data_parallel": "ddp"})


def test_memory_savings_is_a_placement_field_old_files_load_with_auto(tmp_path):
    p = proj("mlp_digits")  # the example files predate the field
    assert p.placement.memory_savings == "auto"
    p.placement.memory_savings = "off"
    save_project(p, tmp_path / "x.lflow")
    assert load_project(tmp_path / "x.lflow").placement.memory_savings == "off"
    from engine.project import PlacementError

    with pytest.raises(PlacementError, match="placement.memory_savings"):
        p.placement.memory_savings = "sometimes"
