"""The planner: validation messages with numbers and the setting to change, plan
document contents (layouts in DTensor and OneFlow names, communication, memory,
bubble), batch-dependent warnings, auto-placement. No processes are started here;
tests/engine/runtime/test_dist_equivalence.py checks the predictions against real ranks."""
from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from engine.planning.autoplace import apply_to_project, auto_place, auto_tp_styles, balanced_stages, sequence_norms
from engine.diagram.compile import compile_graph
from engine.planning.cost import bubble_fraction, local_cpu
from engine.planning.planner import chunk_len, format_plan, make_plan, mesh_ranks
from engine.project import load_project

EXAMPLES = Path(__file__).resolve().parents[3] / "resources" / "examples"


def proj(name: str):
    return load_project(EXAMPLES / f"{name}.lflow")


def one_error(plan, *fragments):
    hits = [e for e in plan.errors if all(f in e for f in fragments)]
    assert hits, f"no error with {fragments} in {plan.errors}"
    return hits[0]


# ----- validation messages --------------------------------------------------------
def test_world_size_must_equal_devices():
    e = one_error(make_plan(proj("mlp_digits"), 4, placement={"dp": 2}), "pp=1 x dp=2 x tp=1 = 2", "4")
    assert "--nproc 2" in e and "pp*dp*tp = 4" in e


def test_tp_must_divide_the_split_dimension():
    p = proj("mlp_digits")
    plan = make_plan(p, 3, placement={"tp": 3}, styles={"fc1": "colwise", "fc2": "rowwise"})
    e = one_error(plan, "'fc1'", "tp=3", "out_features=128")
    assert "replicate" in e and "2, 4, 8" in e
    one_error(plan, "'fc2'", "in_features=128")
    p = proj("transformer_synthetic")
    one_error(make_plan(p, 3, placement={"tp": 3}, styles={"attn": "colwise"}), "'attn'", "num_heads=4")


def test_tp_style_only_where_the_layer_supports_it():
    p = proj("transformer_synthetic")
    e = one_error(make_plan(p, 2, placement={"tp": 2}, styles={"ln1": "colwise"}), "'ln1' (LayerNorm)", "'colwise'")
    assert "sequence, replicate" in e
    one_error(make_plan(p, 2, placement={"tp": 2}, styles={"gelu": "rowwise"}), "'gelu' (GELU)", "only replicate")
    one_error(make_plan(p, 2, placement={"tp": 2}, styles={"ln1": "colwise"}), "'ln1'", "sequence, replicate")


SP = {"attn": "colwise", "fc_in": "colwise", "fc_out": "rowwise", "ln1": "sequence", "ln2": "sequence", "ln_f": "sequence"}


def test_sequence_parallel_norms_plan_megatron_sp():
    """The norms run on Shard(1) tokens; row-wise layers reduce-scatter into them,
    column-wise ones all-gather out of them (and reduce-scatter their input gradient),
    the layer feeding the region keeps its chunk, the pooling gathers."""
    plan = make_plan(proj("transformer_synthetic"), 2, placement={"tp": 2}, styles=SP)
    assert plan.ok, plan.errors
    tpp = plan.doc["tp_plan"]
    assert (tpp["ln1"]["input"], tpp["ln1"]["output"]) == ("Shard(1)", "Shard(1)")
    assert (tpp["fc_in"]["input"], tpp["fc_in"]["output"]) == ("Shard(1)", "Shard(-1)")
    assert (tpp["fc_out"]["input"], tpp["fc_out"]["output"]) == ("Shard(-1)", "Shard(1)")
    assert tpp["attn"]["output"] == "Shard(1)" and tpp["pos"] == {"style": "replicate", "type": "PositionalEmbedding",
                                                                  "input": "Replicate()", "output": "Shard(1)"}
    assert (tpp["pool"]["input"], tpp["pool"]["output"]) == ("Shard(1)", "Replicate()")
    assert "res1" not in tpp  # the residual add runs on its shard as it is
    edge = next(e for e in plan.doc["layouts"] if e["edge"] == "res1 -> res2")
    assert edge["dtensor"] == "[Replicate(), Shard(1)]" and edge["oneflow"] == "(broadcast, split(1))"
    ops = {(c["where"], c["op"]) for c in plan.doc["communication"]}
    assert {("node fc_out", "reduce-scatter"), ("node fc_in", "all-gather"), ("node fc_in", "reduce-scatter"),
            ("node pool", "all-gather"), ("node ln1", "all-reduce")} <= ops
    assert ("node fc_out", "all-reduce") not in ops  # reduce-scatter replaces it
    # half the tokens of every norm, add and residual are kept for backward
    plain = make_plan(proj("transformer_synthetic"), 2, placement={"tp": 2}, styles={k: v for k, v in SP.items() if v != "sequence"})
    assert plan.doc["devices"][0]["memory"]["activations_bytes"] < plain.doc["devices"][0]["memory"]["activations_bytes"]
    assert "Shard(1) (split(1))" in format_plan(plan)


def test_sequence_parallel_errors_name_the_node_and_numbers():
    p = proj("transformer_synthetic")
    e = one_error(make_plan(p, 3, placement={"tp": 3}, styles={"ln1": "sequence"}), "'ln1'", "tp=3", "sequence length 16")
    assert "2, 4, 8, 16" in e and "replicate" in e
    g = p.graph  # a norm on [batch, features]: no sequence to split
    g.add_node("LayerNorm", id="ln_pool")
    for edge in list(g.outgoing("pool")):
        g.disconnect(edge)
    g.connect("pool", "out", "ln_pool", "in")
    g.connect("ln_pool", "out", "head", "in")
    one_error(make_plan(p, 2, placement={"tp": 2}, styles={"ln_pool": "sequence"}), "'ln_pool'", "[None, 64]",
              "sequence (dim 1")


def test_stages_must_follow_the_data_flow():
    p = proj("mlp_digits")
    e = one_error(make_plan(p, 2, placement={"pp": 2, "microbatches": 2},
                            stages=[["fc1", "fc2", "act2", "head"], ["act1"]]), "edge act1 -> fc2", "stage 1 back to stage 0")
    assert "set 'fc2' to stage 1 or later" in e
    for n, s in {"fc1": 0, "act1": 1, "fc2": 0}.items():  # the same mistake drawn in the diagram
        p.graph.set_placement(n, stage=s)
    one_error(make_plan(p, 2, placement={"pp": 2, "microbatches": 2}), "edge act1 -> fc2")
    p.graph.set_placement("fc2", stage=3)
    one_error(make_plan(p, 2, placement={"pp": 2, "microbatches": 2}), "'fc2'", "stage 3 but placement.pp is 2")


def test_1f1b_needs_microbatches_at_least_stages():
    e = one_error(make_plan(proj("resnet_synthetic"), 4, placement={"pp": 4, "microbatches": 2, "schedule": "1f1b"}),
                  "microbatches is 2", "pp is 4")
    assert "raise placement.microbatches to 4 (or leave it unset" in e
    assert make_plan(proj("resnet_synthetic"), 4, placement={"pp": 4, "microbatches": 2, "schedule": "gpipe"}).ok


def test_batch_divisible_by_dp_times_microbatches():
    p = proj("resnet_synthetic")  # batch 32
    p.training.batch_size = 30
    e = one_error(make_plan(p, 4, placement={"pp": 2, "dp": 2, "microbatches": 2}), "batch_size 30", "dp=2 x microbatches=2 = 4")
    assert "multiple of 4 (e.g. 32)" in e


def test_memory_over_capacity_names_rank_and_sizes():
    tiny = replace(local_cpu(), name="tiny", memory_bytes=64 * 1024)
    e = one_error(make_plan(proj("mlp_digits"), 1, device=tiny), "rank 0 (stage 0) needs", "tiny device has 64.0 KiB")
    assert "parameters" in e and "activations" in e and "raise pp or tp" in e


def test_ddp_with_tp_and_uneven_interleaving_are_refused_with_the_fix():
    p = proj("mlp_digits")
    one_error(make_plan(p, 4, placement={"dp": 2, "tp": 2, "data_parallel": "ddp"}, styles={"fc1": "colwise"}),
              "ddp with tp=2", "set placement.data_parallel to fsdp")
    for n, st in {"fc1": 0, "act1": 1, "fc2": 2}.items():  # 3 stages cannot share 2 ranks evenly
        p.graph.set_placement(n, stage=st)
    one_error(make_plan(p, 2, placement={"pp": 2, "microbatches": 2, "schedule": "interleaved1f1b"}),
              "interleaved1f1b", "multiple of pp=2 and at least 4, but it is 3", "or choose 1f1b")


def test_interleaved_puts_stage_s_on_rank_s_mod_pp():
    plan = make_plan(proj("resnet_synthetic"), 2, placement={"pp": 2, "microbatches": 4, "schedule": "interleaved1f1b"})
    assert plan.ok, plan.errors
    assert len(plan.doc["stages"]) == 4 and plan.doc["stages_per_rank"] == 2
    assert [d["stages"] for d in plan.doc["devices"]] == [[0, 2], [1, 3]]
    assert plan.doc["bubble_fraction"] == pytest.approx(1 / (2 * 4 + 1))  # (p-1)/(v*m+p-1)
    assert len([c for c in plan.doc["communication"] if c["op"] == "send/recv"]) == 3


def test_interleaved_zero_bubble_leaves_a_third_of_the_bubble():
    """ZB-H1: the weight gradient fills the fill-and-drain, a third is left: (p-1)/(3vm+p-1)
    of the idle share's numerator, on the same stages and ranks as interleaved 1F1B."""
    place = {"pp": 2, "microbatches": 4}
    one = make_plan(proj("resnet_synthetic"), 2, placement={**place, "schedule": "interleaved1f1b"})
    zb = make_plan(proj("resnet_synthetic"), 2, placement={**place, "schedule": "interleavedzb"})
    assert zb.ok, zb.errors
    assert [d["stages"] for d in zb.doc["devices"]] == [[0, 2], [1, 3]] and zb.doc["schedule"] == "interleavedzb"
    assert zb.doc["bubble_fraction"] == pytest.approx((1 / 3) / (2 * 4 + 1))
    assert zb.predicted.compute_s < one.predicted.compute_s
    assert zb.predicted.peak_bytes_max <= one.predicted.peak_bytes_max  # at most 1F1B's micro-batches in flight


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_v_shaped_schedules_put_first_and_last_stage_on_rank_0(schedule):
    """ZB-V and DualPipeV: two stages per rank in a V (rank r holds r and 2p-1-r), no bubble
    left with 2p micro-batches or more (the papers' balanced case), 1F1B's activations in
    flight (DualPipeV one micro-batch more); fewer stages or micro-batches are refused
    with the number to set."""
    place = {"pp": 2, "microbatches": 4, "schedule": schedule}
    v = make_plan(proj("resnet_synthetic"), 2, placement=place)
    assert v.ok, v.errors
    assert [d["stages"] for d in v.doc["devices"]] == [[0, 3], [1, 2]] and v.doc["stages_per_rank"] == 2
    assert v.doc["bubble_fraction"] == 0.0
    loop = make_plan(proj("resnet_synthetic"), 2, placement={**place, "schedule": "interleaved1f1b"})
    assert v.predicted.compute_s < loop.predicted.compute_s
    zb = make_plan(proj("resnet_synthetic"), 2, placement={**place, "schedule": "interleavedzb"})
    acts = [d.memory.activations_bytes for d in v.devices]
    if schedule == "zbv":  # p micro-batches of every stage, as ZB-H1 holds
        assert sum(acts) == sum(d.memory.activations_bytes for d in zb.devices)
    else:
        assert sum(acts) > sum(d.memory.activations_bytes for d in zb.devices)
    one_error(make_plan(proj("resnet_synthetic"), 2, placement={**place, "microbatches": 2}),
              f"placement.schedule {schedule} with pp=2 needs at least 4 micro-batches", "set placement.microbatches to 4")
    cut3 = [["stem", "stem_act", "b1_conv1", "b1_act1"], ["b1_conv2", "b1_add", "b1_act2", "b2_conv1", "b2_act1"],
            ["b2_conv2", "b2_add", "b2_act2", "gap", "flat", "head"]]
    three = make_plan(proj("resnet_synthetic"), 2, placement=place, stages=cut3)
    assert any("exactly 4 stages for pp=2, but there are 3" in e for e in three.errors), three.errors


# ----- batch-dependent layers -------------------------------------------------------
def test_batchnorm_and_dropout_warnings_offer_the_fix():
    p = proj("cnn_digits")  # has BatchNorm2d bn1, batch 64
    w = make_plan(p, 2, placement={"dp": 2}).warnings
    assert any("'bn1'" in x and "32 samples" in x and "global batch of 64" in x and "sync_batchnorm" in x for x in w)
    w = make_plan(p, 2, placement={"pp": 2, "microbatches": 4}).warnings
    assert any("'bn1'" in x and "micro-batches of 16" in x and "training.grad_accumulation=4" in x
               and "--accumulate 4" in x for x in w)
    assert not any("'bn1'" in x for x in make_plan(p, 1).warnings)
    assert not any("'bn1'" in x for x in make_plan(p, 2, placement={"dp": 2, "sync_batchnorm": True}).warnings)
    p.training.grad_accumulation = 4  # the comparison run: one process only
    assert make_plan(p, 1).ok
    one_error(make_plan(p, 2, placement={"dp": 2}), "training.grad_accumulation 4", "2 processes", "set it to 1")
    g = proj("mlp_digits")
    g.graph.insert_node(type(g.graph.nodes["act1"])(id="drop", type="Dropout", params={"p": 0.1}))
    e = g.graph.outgoing("act1")[0]
    g.graph.disconnect(e)
    g.graph.connect("act1", "out", "drop", "in")
    g.graph.connect("drop", "out", e.dst, e.dst_port)
    w = make_plan(g, 2, placement={"dp": 2}).warnings
    assert any("'drop' (Dropout)" in x and "p=0" in x for x in w)
    assert not [b for b in ("resnet_synthetic", "mlp_digits", "transformer_synthetic")
                if make_plan(proj(b), 2, placement={"dp": 2}).warnings]


# ----- the plan document --------------------------------------------------------------
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("pp,m", [(2, 2), (2, 4), (4, 4), (4, 8)])
def test_bubble_fraction(schedule, pp, m):
    plan = make_plan(proj("resnet_synthetic"), pp, placement={"pp": pp, "microbatches": m, "schedule": schedule})
    assert plan.ok, plan.errors
    assert plan.doc["bubble_fraction"] == pytest.approx((pp - 1) / (m + pp - 1))
    assert bubble_fraction(1, 8) == 0


def test_plan_is_readable_json_with_mesh_stages_layouts_and_comms():
    p = proj("transformer_synthetic")
    plan = make_plan(p, 4, placement={"pp": 2, "tp": 2, "microbatches": 2},
                     styles={"attn": "colwise", "fc_in": "colwise", "fc_out": "rowwise"})
    assert plan.ok, plan.errors
    doc = json.loads(plan.to_json())
    assert doc["mesh"]["shape"] == [2, 1, 2]
    assert doc["mesh"]["groups"]["tp"] == [[0, 1], [2, 3]] and doc["mesh"]["groups"]["pp"] == [[0, 2], [1, 3]]
    assert sum(len(s) for s in doc["stages"]) == 13
    fc_in, fc_out = doc["tp_plan"]["fc_in"], doc["tp_plan"]["fc_out"]
    if fc_in and doc["stages"][0].count("fc_in") == doc["stages"][0].count("fc_out"):  # same stage: no gather
        assert fc_in["output"] == "Shard(-1)" and fc_out["input"] == "Shard(-1)"
    edge = next(e for e in doc["layouts"] if e["edge"] == "fc_in -> gelu")
    assert edge["dtensor"] == "[Replicate(), Shard(-1)]" and edge["oneflow"] == "(broadcast, split(-1))"
    ops = {(c["op"], c["group"]) for c in doc["communication"]}
    assert ("send/recv", "pp") in ops and ("all-reduce", "tp") in ops
    assert all(c["bytes_per_step"] > 0 for c in doc["communication"])
    assert {"params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "total_bytes"} <= set(doc["devices"][0]["memory"])
    text = format_plan(plan)
    assert "stage 0 (ranks [0, 1])" in text and "split(-1)" in text and "bubble 33.3%" in text


def test_the_plan_is_typed_and_its_json_is_made_from_the_types():
    """Readers use the typed fields (the runtime's RunPlan, per-rank loads, collectives,
    edge layouts, the prediction); `doc` is derived from them, so a correction made to a
    field (calibration) shows in the JSON too."""
    from engine.planning.comms import Comm, EdgeLayout
    from engine.planning.cost import Memory, Prediction, RankLoad
    from engine.runtime.plan import Layout, RunPlan, shard

    plan = make_plan(proj("transformer_synthetic"), 4, placement={"pp": 2, "tp": 2, "microbatches": 2},
                     styles={"attn": "colwise", "fc_in": "colwise", "fc_out": "rowwise"})
    assert plan.ok, plan.errors
    assert isinstance(plan.run, RunPlan) and plan.run.world == plan.world == 4 and plan.run_plan() is plan.run
    assert all(isinstance(d, RankLoad) and isinstance(d.memory, Memory) for d in plan.devices)
    assert [d.rank for d in plan.devices] == [0, 1, 2, 3] and [d.stage for d in plan.devices] == [0, 0, 1, 1]
    assert all(isinstance(c, Comm) for c in plan.communication) and all(isinstance(e, EdgeLayout) for e in plan.layouts)
    assert all(isinstance(e.tp, Layout) for e in plan.layouts)
    fc_in = next(e for e in plan.layouts if (e.src, e.dst) == ("fc_in", "gelu"))
    assert fc_in.tp == shard(-1) and plan.run.tp_plan["fc_in"].output == shard(-1)
    cuts = [c for c in plan.communication if c.op == "send/recv"]
    assert len(cuts) == 1 and cuts[0].values and cuts[0].node is None
    assert {c.node for c in plan.communication if c.group == "tp"} >= {"fc_out"}
    doc = plan.doc
    for d, j in zip(plan.devices, doc["devices"]):
        assert j["memory"]["total_bytes"] == d.memory.total_bytes == d.memory.state_bytes + d.memory.activations_bytes
        assert j["params"] == d.params and j["stages"] == d.stages
    assert [c["per_rank_bytes"] for c in doc["communication"]] == [c.per_rank_bytes for c in plan.communication]
    assert isinstance(plan.predicted, Prediction) and plan.predicted.peak_bytes_max == max(
        d.memory.total_bytes for d in plan.devices)
    assert "calibrated_step_s" not in doc["predicted"]
    plan.predicted.calibrated_step_s = 2 * plan.predicted.step_s
    assert plan.doc["predicted"]["calibrated_step_s"] == 2 * plan.predicted.step_s
    assert json.loads(plan.to_json())["stages"] == plan.run.stages
    assert plan.runtime_plan()["predicted"]["step_s"] == plan.predicted.step_s
    failed = make_plan(proj("transformer_synthetic"), 4, compiled=replace(compile_graph(proj("transformer_synthetic").graph),
                                                                          errors=["broken"]))
    assert failed.run is None and not failed.ok and failed.doc == {"version": plan.run.version}
    with pytest.raises(ValueError, match="no plan"):
        failed.run_plan()


def test_colwise_not_followed_by_rowwise_is_gathered():
    plan = make_plan(proj("mlp_digits"), 2, placement={"tp": 2}, styles={"fc1": "colwise"})
    assert plan.doc["tp_plan"]["fc1"]["output"] == "Replicate()"
    assert any(c["op"] == "all-gather" and c["where"] == "node fc1" for c in plan.doc["communication"])


def test_skip_carried_through_a_middle_stage_is_listed():
    stages = [["stem", "stem_act"], ["b1_conv1", "b1_act1"], ["b1_conv2", "b1_add", "b1_act2", "b2_conv1"],
              ["b2_act1", "b2_conv2", "b2_add", "b2_act2", "gap", "flat", "head"]]
    plan = make_plan(proj("resnet_synthetic"), 4, placement={"pp": 4, "microbatches": 4}, stages=stages)
    cut1 = next(c for c in plan.doc["communication"] if c["where"] == "cut stage 1 -> 2")
    assert cut1["values"] == ["stem_act", "b1_act1"] and cut1["carried_through"] == ["stem_act"]
    assert any(e.get("crosses") == "stage 0 -> stage 2" for e in plan.doc["layouts"] if e["edge"] == "stem_act -> b1_add")


def test_sharded_parameters_add_up_to_the_model():
    p = proj("transformer_synthetic")
    total = compile_graph(p.graph).total_params
    for placement, styles in [({"dp": 4, "data_parallel": "fsdp"}, None), ({"dp": 3, "data_parallel": "fsdp"}, None),
                              ({"tp": 2}, {"attn": "colwise", "fc_in": "colwise", "fc_out": "rowwise"}),
                              ({"pp": 2, "microbatches": 2}, None)]:
        p.training.batch_size = 48 if placement.get("dp") == 3 else 32
        plan = make_plan(p, None, placement=placement, styles=styles)
        assert plan.ok, plan.errors
        if "tp" in placement:  # replicated parameters (norms, row-wise biases) count once per tp rank
            assert sum(d["params"] for d in plan.doc["devices"]) > total
        else:
            assert sum(d["params"] for d in plan.doc["devices"]) == total
    assert [chunk_len(10, 4, i) for i in range(4)] == [3, 3, 3, 1]
    assert [chunk_len(2, 4, i) for i in range(4)] == [1, 1, 0, 0]


def test_optimizer_memory_by_kind():
    p = proj("mlp_digits")
    n = compile_graph(p.graph).total_params
    adam = make_plan(p, 1).doc["devices"][0]["memory"]
    assert adam["params_bytes"] == adam["grads_bytes"] == 4 * n
    assert adam["optimizer_bytes"] == 8 * n + 4 * 6  # exp_avg, exp_avg_sq, and a float32 step per tensor
    p.training.optimizer.name, p.training.optimizer.momentum = "sgd", 0.9
    assert make_plan(p, 1).doc["devices"][0]["memory"]["optimizer_bytes"] == 4 * n
    p.training.optimizer.momentum = 0.0
    assert make_plan(p, 1).doc["devices"][0]["memory"]["optimizer_bytes"] == 0


def test_mesh_rank_layout_matches_init_device_mesh():
    m = mesh_ranks(2, 2, 2)
    assert m["ranks"] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    assert m["coords"][5] == (1, 0, 1)


# ----- auto-placement ------------------------------------------------------------------
def test_auto_place_prefers_data_parallel_when_the_model_fits():
    a = auto_place(proj("resnet_synthetic"), 4)
    assert (a.placement["pp"], a.placement["dp"], a.placement["tp"]) == (1, 4, 1)
    assert a.plan.ok and a.reasons and "chose pp=1 x dp=4 x tp=1" in a.reasons[0]
    assert len(a.candidates) >= 3


def test_auto_place_cuts_stages_under_a_memory_limit():
    p = proj("transformer_synthetic")
    compiled = compile_graph(p.graph)
    ddp2 = make_plan(p, 2, placement={"dp": 2}).doc["devices"][0]["memory"]["total_bytes"]
    small = replace(local_cpu(), memory_bytes=ddp2 - 1)  # plain data parallel no longer fits
    p.placement.memory_savings = "off"  # (with "auto" the planner checkpoints instead: tests/engine/planning/test_memory_choice.py)
    a = auto_place(p, 2, small, compiled)
    assert a.plan.memory_savings is None and a.plan.run.checkpoint == []
    assert a.plan.ok and (a.placement["pp"] > 1 or a.placement["tp"] > 1 or a.placement["data_parallel"] == "fsdp")
    assert all(d["memory"]["total_bytes"] <= small.memory_bytes for d in a.plan.doc["devices"])
    with pytest.raises(ValueError, match="no layout of 2 devices fits"):
        auto_place(p, 2, replace(small, memory_bytes=1024), compiled)


def test_balanced_stages_are_contiguous_and_even():
    p = proj("resnet_synthetic")
    c = compile_graph(p.graph)
    stages, reasons = balanced_stages(c, 2, local_cpu(), batch_size=32)
    order = [n for n in c.order if n not in ("x", "out")]
    assert stages[0] + stages[1] == order and all(stages)
    f = [sum(c.nodes[n].flops for n in s) for s in stages]
    assert max(f) / (sum(f) / 2) < 1.5 and "slowest/mean" in reasons[0]


def test_auto_tp_styles_pair_megatron_style_and_accept_into_the_diagram():
    p = proj("transformer_synthetic")
    c = compile_graph(p.graph)
    assert auto_tp_styles(c, 2) == {"attn": "colwise", "fc_in": "colwise", "fc_out": "rowwise"}
    assert auto_tp_styles(c, 3) == {}
    ddp2 = make_plan(p, 2, placement={"dp": 2}).doc["devices"][0]["memory"]["total_bytes"]
    small = replace(local_cpu(), memory_bytes=ddp2 - 1)
    a = auto_place(p, 2, small, c)
    apply_to_project(p, a)
    assert p.placement.pp == a.placement["pp"] and p.placement.tp == a.placement["tp"]
    again = make_plan(p, 2, small)  # (on the same device: the memory savings it chose come again)
    assert again.ok and again.doc["stages"] == a.stages
    assert math.isclose(again.doc["predicted"]["step_s"], a.plan.doc["predicted"]["step_s"])


def test_auto_placement_adds_sequence_parallel_norms_where_they_plan():
    p = proj("transformer_synthetic")
    c = compile_graph(p.graph)
    styles = sequence_norms(c, auto_tp_styles(c, 2), 2)
    assert {n: s for n, s in styles.items() if s == "sequence"} == {"ln1": "sequence", "ln2": "sequence", "ln_f": "sequence"}
    assert sequence_norms(c, {}, 3) == {}  # 3 does not divide the 16 tokens
    tp2 = next(x for x in auto_place(p, 2, compiled=c).candidates if x["tp"] == 2)
    assert tp2["feasible"] and tp2["sequence_parallel"]
    # an Input straight into a norm cannot hand it a shard: the candidate plans without it
    g = p.graph
    g.remove_node("embed")
    g.remove_node("pos")
    g.set_param("tokens", "dtype", "float32")
    g.set_param("tokens", "shape", [16, 64])
    g.connect("tokens", "out", "ln1", "in")
    g.connect("tokens", "out", "res1", "b")
    c = compile_graph(g)
    assert c.ok, c.errors
    tp2 = next(x for x in auto_place(p, 2, compiled=c).candidates if x["tp"] == 2)
    assert tp2["feasible"] and not tp2["sequence_parallel"]


def test_layers_without_parameters_plan_under_every_axis():
    """MatMul (a function layer, like Add) holds no module: memory counts skip it."""
    from interop_models import attention_parts

    from engine.project import Project

    p = Project(attention_parts())
    for placement in ({"dp": 2}, {"tp": 2}, {"pp": 2, "microbatches": 2}):
        plan = make_plan(p, 2, placement=placement)
        assert plan.ok, (placement, plan.errors)
    whole = sum(t.numel() for t in compile_graph(p.graph).build().parameters())
    assert sum(d["params"] for d in make_plan(p, 2, placement={"pp": 2, "microbatches": 2}).doc["devices"]) == whole
