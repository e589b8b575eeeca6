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

from engine.planning.autoplace import auto_place
from engine.diagram.compile import compile_graph
from engine.planning.cost import activation_bytes, kept_outputs, local_cpu
from engine.planning.planner import checkpoint_units, format_plan, make_plan
from engine.project import load_project, save_project
from engine.runtime.plan import PlanError, RunPlan

EXAMPLES = Path(__file__).resolve().parents[3] / "resources" / "examples"


def proj(name: str):
    return load_project(EXAMPLES / f"{name}.lflow")


def dev_below(plan, frac: float = 1.0, less: int = 0):
    peak = plan.predicted.peak_bytes_max
    return replace(plan.device, memory_bytes=int(peak * frac) - less)


def blocked_transformer():
    """The example transformer with its two sublayers as editor blocks (the planner's units:
    each block, and each run of nodes outside blocks, recomputed as one region)."""
    p = proj("transformer_synthetic")
    for n in ("ln1", "attn", "res1"):
        p.graph.set_group(n, "attention")
    for n in ("ln2", "fc_in", "gelu", "fc_out", "res2"):
        p.graph.set_group(n, "mlp")
    return p


def test_a_layout_that_does_not_fit_gets_block_checkpointing_chosen_greedily_and_says_so():
    p = blocked_transformer()
    c = compile_graph(p.graph)
    assert checkpoint_units(c, list(c.order)) == [["embed", "pos"], ["ln1", "attn", "res1"],
                                                  ["ln2", "fc_in", "gelu", "fc_out", "res2"], ["ln_f", "pool", "head"]]
    plain = make_plan(p, 2, placement=p.placement.derive(dp=2))
    assert plain.ok and plain.memory_savings is None and plain.run.checkpoint == []
    small = dev_below(plain, 0.9)
    plan = make_plan(p, 2, small, placement=p.placement.derive(dp=2))
    ms = plan.memory_savings
    assert plan.ok, plan.errors
    assert ms.checkpoint and not ms.cpu_offload and ms.user_checkpoint == [] and ms.fits
    assert plan.run.checkpoint == ms.checkpoint  # what the ranks run
    assert all(d.memory.total_bytes <= small.memory_bytes for d in plan.devices)
    assert ms.freed_bytes == plain.predicted.peak_bytes_max - plan.predicted.peak_bytes_max > 0
    # whole units only; a region keeps what it hands on (the block's last output), frees the rest
    units = {u[0]: u for u in checkpoint_units(c, list(c.order))}
    chosen = [units[first] for first in units if units[first][0] in ms.checkpoint]
    assert sorted(n for u in chosen for n in u) == sorted(ms.checkpoint)
    assert ms.units == [p.graph.nodes[u[0]].group or (u[0] if len(u) == 1 else f"{u[0]}..{u[-1]}") for u in chosen]
    ids = list(c.order)

    def acts(ckpt):
        return activation_bytes(c, ids, {}, 1, 16, 1, 1, 0, "1f1b", set(ckpt))

    assert kept_outputs(c, ids, set(ms.checkpoint)) == set(ids) - {n for u in chosen for n in u[:-1]}
    assert plain.predicted.peak_bytes_max - (acts([]) - acts(ms.checkpoint)) == plan.predicted.peak_bytes_max
    # greedy and minimal: without its last choice (the unit freeing least per FLOP) it would not fit
    ratio = {u[0]: (acts([]) - acts(u)) / max(1.0, sum(c.nodes[n].flops for n in u)) for u in chosen}
    last = min(chosen, key=lambda u: ratio[u[0]])
    assert plan.predicted.peak_bytes_max + (acts([]) - acts(last)) > small.memory_bytes
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


def test_one_layer_checkpointed_alone_frees_nothing_a_run_of_layers_frees_its_inside():
    """What autograd really keeps: the next layer holds a lone checkpointed layer's output."""
    p = proj("mlp_digits")
    c = compile_graph(p.graph)
    ids = list(c.order)
    assert kept_outputs(c, ids, {"fc2"}) == set(ids)
    assert kept_outputs(c, ids, {"fc1", "act1", "fc2"}) == set(ids) - {"fc1", "act1"}


def test_saved_activations_measured_follow_the_planners_regions():
    """The runtime's regions (engine/runtime/distributed/stages.py) on a real forward: the bytes autograd
    saves for backward (saved_tensors_hooks) fall with checkpointing by what the planner
    frees, within the estimate's own slack (it counts each layer's output, not each op's)."""
    import torch

    from engine.runtime.model import build_graph_module
    from engine.runtime.distributed.stages import apply_checkpointing, top_blocks

    p = blocked_transformer()
    c = compile_graph(p.graph)
    ids = list(c.order)
    blocks = top_blocks(c.spec["nodes"])
    vocab = p.graph.nodes["embed"].params["num_embeddings"]

    def saved(ckpt) -> int:
        gm = apply_checkpointing(build_graph_module(c.spec, seed=0), set(ckpt), blocks)
        params = {q.untyped_storage().data_ptr() for q in gm.parameters()}
        seen = {}

        def pack(t):
            if t.untyped_storage().data_ptr() not in params:
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        x = torch.randint(0, vocab, (16, *p.graph.nodes["tokens"].params["shape"]))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            gm(x).sum()
        return sum(seen.values())

    def predicted(ckpt) -> int:
        return activation_bytes(c, ids, {}, 1, 16, 1, 1, 0, "1f1b", set(ckpt))

    block = ["ln2", "fc_in", "gelu", "fc_out", "res2"]
    assert saved(["fc_in"]) >= saved([])  # alone: nothing saved (and the planner says so)
    assert predicted(["fc_in"]) == predicted([])
    freed_real, freed_pred = saved([]) - saved(block), predicted([]) - predicted(block)
    assert freed_real > 0 and freed_pred > 0
    assert 0.5 < freed_real / freed_pred < 2.0, (freed_real, freed_pred)
    # the same model trains the same with and without its regions (recomputation is exact)
    torch.manual_seed(0)
    x = torch.randint(0, vocab, (4, *p.graph.nodes["tokens"].params["shape"]))
    grads = []
    for ckpt in ([], block + ["ln1", "attn", "res1"]):
        gm = apply_checkpointing(build_graph_module(c.spec, seed=0), set(ckpt), blocks)
        gm(x).float().pow(2).mean().backward()
        grads.append({k: v.grad.clone() for k, v in gm.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for k in grads[0]:
        torch.testing.assert_close(grads[0][k], grads[1][k], rtol=1e-5, atol=1e-6)


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
    p = blocked_transformer()
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
