"""Every layout trains the bundled examples to the single-process losses.

Real torchrun, real gloo, the product's ParallelTrainer and fit loop. Two torchrun
launches (2 and 4 processes) each run several layouts in turn (tests/engine/
_dist_worker.py), since starting processes costs more than the layouts do. For
each layout: the loss of each of 20 steps matches the single-process run with the
same seed, data order and global batch within 1e-4 relative; each rank's
parameter/gradient/optimizer bytes equal the planner's prediction exactly; a
checkpoint written under dp=2 resumes under pp=2 and in one process.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from engine.planning.planner import make_plan
from engine.project import load_project
from engine.runs.build import prepare_run

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "resources" / "examples"
WORKER = Path(__file__).with_name("_dist_worker.py")
STEPS = 20
RTOL = 1e-4

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("torchrun")]

RESNET_2 = [["stem", "stem_act", "b1_conv1", "b1_act1"],  # stem_act -> b1_add crosses the cut
            ["b1_conv2", "b1_add", "b1_act2", "b2_conv1", "b2_act1", "b2_conv2", "b2_add", "b2_act2", "gap", "flat", "head"]]
RESNET_4 = [["stem", "stem_act"], ["b1_conv1", "b1_act1"],  # stem_act is carried through stage 1
            ["b1_conv2", "b1_add", "b1_act2", "b2_conv1"], ["b2_act1", "b2_conv2", "b2_add", "b2_act2", "gap", "flat", "head"]]
MLP_TP = {"fc1": "colwise", "fc2": "rowwise"}
TRANSFORMER_TP = {"attn": "colwise", "fc_in": "colwise", "fc_out": "rowwise"}
# Megatron-SP: the norms (and the residual adds between them) run on half of the 16 tokens
TRANSFORMER_SP = {**TRANSFORMER_TP, "ln1": "sequence", "ln2": "sequence", "ln_f": "sequence"}
TRANSFORMER_PP = [["embed", "pos", "ln1", "attn", "res1", "ln2"],  # res1 and ln2 cross the cut as Shard(1)
                  ["fc_in", "gelu", "fc_out", "res2", "ln_f", "pool", "head"]]

# name: (example, placement, stages, tp styles)
LAYOUTS_2 = {
    "ddp": ("mlp_digits", {"dp": 2, "data_parallel": "ddp"}, None, None),
    "fsdp": ("mlp_digits", {"dp": 2, "data_parallel": "fsdp"}, None, None, ["fc2"]),  # + activation checkpointing
    "tp": ("mlp_digits", {"tp": 2}, None, None),  # every node on auto: the planner pairs fc1 and fc2 (MLP_TP)
    "tp_attention": ("transformer_synthetic", {"tp": 2}, None, TRANSFORMER_TP),
    "tp_sequence": ("transformer_synthetic", {"tp": 2}, None, TRANSFORMER_SP),
    "pp_gpipe": ("resnet_synthetic", {"pp": 2, "schedule": "gpipe", "microbatches": 2}, RESNET_2, None),
    "pp_1f1b": ("resnet_synthetic", {"pp": 2, "schedule": "1f1b", "microbatches": 4}, RESNET_2, None),
    "tp_clip": ("mlp_digits+clip", {"tp": 2}, None, MLP_TP),  # sharded and replicated gradients in one norm
    "pp_clip": ("resnet_synthetic+clip", {"pp": 2, "microbatches": 2}, RESNET_2, None),  # norm over stages
    # 4 stages on 2 ranks: rank 0 runs stages 0 and 2, rank 1 stages 1 and 3
    "pp_interleaved": ("resnet_synthetic", {"pp": 2, "schedule": "interleaved1f1b", "microbatches": 4}, RESNET_4, None),
    # interleaved zero bubble (the weight gradient split from the input's and run in the bubble)
    "pp_interleaved_zb": ("resnet_synthetic", {"pp": 2, "schedule": "interleavedzb", "microbatches": 4}, RESNET_4, None),
    # V-shaped: rank 0 runs stages 0 and 3 (the first and the last), rank 1 stages 1 and 2;
    # evaluated every 5 steps (a forward-only schedule of their own), training on after each
    "pp_zbv": ("resnet_synthetic+eval5", {"pp": 2, "schedule": "zbv", "microbatches": 4}, RESNET_4, None),
    "pp_dualpipev": ("resnet_synthetic+eval5", {"pp": 2, "schedule": "dualpipev", "microbatches": 4}, RESNET_4, None),
}
EVAL5 = ("pp_zbv", "pp_dualpipev")
# recorded every 4 steps (the hot path: losses summed on the device, one collective per record)
LOG4 = {"pp_clip_log4": ("resnet_synthetic+clip+log4", {"pp": 2, "microbatches": 2}, RESNET_2, None)}
BF16 = {"fsdp_bf16": ("mlp_digits", {"dp": 2, "data_parallel": "fsdp", "mixed_precision": "bf16"}, None, None),
        "pp_bf16": ("resnet_synthetic", {"pp": 2, "microbatches": 2, "mixed_precision": "bf16"}, RESNET_2, None),
        # BatchNorm under FSDP's bf16 policy: units of their own kept in float32
        "fsdp_bf16_batchnorm": ("resnet_synthetic", {"dp": 2, "data_parallel": "fsdp", "mixed_precision": "bf16"},
                                None, None)}
LAYOUTS_4 = {
    "pp_x_dp": ("resnet_synthetic", {"pp": 2, "dp": 2, "data_parallel": "fsdp", "microbatches": 2,
                                     "reshard_after_forward": False}, RESNET_2, None),
    "dp_x_tp": ("transformer_synthetic", {"dp": 2, "tp": 2, "data_parallel": "fsdp"}, None, TRANSFORMER_TP),
    "pp_x_tp_sequence": ("transformer_synthetic", {"pp": 2, "tp": 2, "microbatches": 2}, TRANSFORMER_PP, TRANSFORMER_SP),
    "pp4_1f1b": ("resnet_synthetic", {"pp": 4, "schedule": "1f1b", "microbatches": 4}, RESNET_4, None),
    # DDP inside a pipeline: the stage's gradients averaged after the schedule (parallel.dp_by_hand)
    "pp_x_ddp": ("resnet_synthetic", {"pp": 2, "dp": 2, "data_parallel": "ddp", "microbatches": 2}, RESNET_2, None),
}
MLP_PP = [["fc1", "act1"], ["fc2", "act2", "head"]]


def _project(example: str):
    """An example; "NAME+clip" adds gradient clipping tight enough to act on every step,
    "+log4" records the loss every 4 steps (else every step, to compare step by step),
    "+eval5" evaluates every 5 steps (else at the end)."""
    example, *flags = example.split("+")
    p = load_project(EXAMPLES / f"{example}.lflow")
    if "clip" in flags:
        p.training.grad_clip = 0.05
    p.training.checkpoint_interval = 10
    p.training.eval_interval = 5 if "eval5" in flags else STEPS
    p.training.log_interval = 4 if "log4" in flags else 1
    return p


def losses(run_dir: Path) -> dict[int, float]:
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "loss" in rec:
            out[rec["step"]] = rec["loss"]
    return out


def _prepare(tmp: Path, name: str, layout, nproc: int):
    example, placement, stages, styles, *ckpt = layout
    project = _project(example)
    for n in (ckpt[0] if ckpt else []):
        project.graph.set_placement(n, checkpoint=True)
    plan = make_plan(project, nproc, placement=placement, stages=stages, styles=styles)
    assert plan.ok, plan.errors
    run_dir = prepare_run(project, tmp / name, steps=STEPS, placement=placement, plan=plan.runtime_plan())
    return run_dir, plan


def _torchrun(nproc: int, jobs: list[dict], tmp: Path) -> None:
    spec = tmp / f"jobs{nproc}.json"
    spec.write_text(json.dumps(jobs))
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                        str(WORKER), str(spec)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    if r.returncode:
        logs = "\n".join(f"--- {p}\n{p.read_text()[-2000:]}" for j in jobs
                         for p in sorted(Path(j["run_dir"]).glob("logs/rank*.log")))
        pytest.fail(f"torchrun failed ({r.returncode}):\n{r.stderr[-4000:]}\n{logs}")


_DONE: dict = {}  # xdist may tear a module fixture down between two tests of a group; the launches run once


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    if "runs" not in _DONE:
        _DONE["runs"] = _shared_once(tmp_path_factory)
    return _DONE["runs"]


def _shared_once(tmp_path_factory):
    """xdist's loadgroup can still hand a group's first tests to another worker: one
    worker launches (under a file lock in the session's shared temp folder), the
    others wait and read its results."""
    import fcntl
    import os
    import pickle

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    result = shared / "dist_equivalence.pkl"
    with open(shared / "dist_equivalence.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if result.exists():
            return pickle.loads(result.read_bytes())
        res = _launch_all(tmp_path_factory)
        result.write_bytes(pickle.dumps(res))
        return res


def _launch_all(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dist")
    from engine.runtime.train import run

    refs = {}
    for example in ("mlp_digits", "resnet_synthetic", "transformer_synthetic", "mlp_digits+clip",
                    "resnet_synthetic+clip", "resnet_synthetic+eval5"):
        d = prepare_run(_project(example), tmp / f"ref_{example.replace('+', '_')}", steps=STEPS)
        run(d)
        refs[example] = losses(d)
        refs.setdefault("eval_dirs", {})[example] = str(d)
    out = {}
    jobs2 = []
    for name, layout in {**LAYOUTS_2, **BF16, **LOG4}.items():
        d, plan = _prepare(tmp, name, layout, 2)
        out[name] = (layout[0], d, plan)
        jobs2.append({"run_dir": str(d)})
    # the dp=2 run's step-10 checkpoint, resumed as a 2-stage pipeline
    mlp_pp = make_plan(_project("mlp_digits"), 2, placement={"pp": 2, "microbatches": 2}, stages=MLP_PP)
    assert mlp_pp.ok, mlp_pp.errors
    jobs2.append({"run_dir": str(tmp / "resume_pp"), "copy_from": {"src": str(out["ddp"][1]), "step": 10},
                  "plan": mlp_pp.runtime_plan(), "resume": True})
    out["resume_pp"] = ("mlp_digits", tmp / "resume_pp", mlp_pp)
    # ... and under tensor parallel (DCP reads column/row shards of the saved whole tensors)
    mlp_tp = make_plan(_project("mlp_digits"), 2, placement={"tp": 2}, styles=MLP_TP)
    jobs2.append({"run_dir": str(tmp / "resume_tp"), "copy_from": {"src": str(out["ddp"][1]), "step": 10},
                  "plan": mlp_tp.runtime_plan(), "resume": True})
    out["resume_tp"] = ("mlp_digits", tmp / "resume_tp", mlp_tp)
    # a single-process checkpoint (trainer.Trainer writes DCP without a process group) resumed by FSDP2 on 2 ranks
    mlp_fsdp = make_plan(_project("mlp_digits"), 2, placement={"dp": 2, "data_parallel": "fsdp"})
    jobs2.append({"run_dir": str(tmp / "resume_from_single"), "copy_from": {"src": str(tmp / "ref_mlp_digits"), "step": 10},
                  "plan": mlp_fsdp.runtime_plan(), "resume": True})
    out["resume_from_single"] = ("mlp_digits", tmp / "resume_from_single", mlp_fsdp)
    # the planner's own memory savings (issue 47): a device that holds not half of dp=2 FSDP's state
    # (so the state goes to the host) and a byte less than the activations left then (so the planner
    # checkpoints a layer too); the run trains as one process does
    fsdp2 = {"dp": 2, "data_parallel": "fsdp"}
    tiny = replace(mlp_fsdp.device, memory_bytes=mlp_fsdp.devices[0].memory.state_bytes // 2)
    offloaded = make_plan(_project("mlp_digits"), 2, tiny, placement=fsdp2)
    tiny = replace(tiny, memory_bytes=max(x.memory.total_bytes for x in offloaded.devices) - 1)
    saved = make_plan(_project("mlp_digits"), 2, tiny, placement=fsdp2)
    assert saved.ok and saved.run.cpu_offload and saved.run.checkpoint, saved.errors
    d = prepare_run(_project("mlp_digits"), tmp / "planned_savings", steps=STEPS, placement=fsdp2,
                    plan=saved.runtime_plan())
    jobs2.append({"run_dir": str(d)})
    out["planned_savings"] = ("mlp_digits", d, saved)
    _torchrun(2, jobs2, tmp)
    jobs4 = []
    for name, layout in LAYOUTS_4.items():
        d, plan = _prepare(tmp, name, layout, 4)
        out[name] = (layout[0], d, plan)
        jobs4.append({"run_dir": str(d)})
    _torchrun(4, jobs4, tmp)
    return refs, out, tmp


@pytest.mark.parametrize("name", [*LAYOUTS_2, *LAYOUTS_4, "planned_savings"])
def test_losses_match_single_process(runs, name):
    refs, out, _ = runs
    example, run_dir, _ = out[name]
    got, want = losses(run_dir), refs[example]
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert got[step] == pytest.approx(want[step], rel=RTOL), f"{name} step {step}"
    assert json.loads((run_dir / "status.json").read_text())["state"] == "succeeded"
    assert (run_dir / "model.pt").exists()


def _evals(run_dir: Path) -> dict[int, dict]:
    recs = (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
    return {r["step"]: r for r in recs if "val_loss" in r}


@pytest.mark.parametrize("name", EVAL5)
def test_pipeline_evaluates_as_one_process_does(runs, name):
    """Evaluation every 5 steps through the pipeline (the V-shaped schedules' own
    forward-only schedule) gives the single process's validation metrics, and training
    after each evaluation goes on as it would have (test_losses_match_single_process)."""
    refs, out, _ = runs
    example, run_dir, _ = out[name]
    want = _evals(Path(refs["eval_dirs"][example]))
    got = _evals(run_dir)
    assert sorted(got) == sorted(want) == [5, 10, 15, 20]
    for step, rec in want.items():
        for key in ("val_loss", "val_acc"):
            if key in rec:
                assert got[step][key] == pytest.approx(rec[key], rel=RTOL), f"{name} step {step} {key}"


@pytest.mark.parametrize("name", list(LOG4))
def test_records_every_few_steps_hold_the_mean_of_those_steps(runs, name):
    """Logged every 4 steps (and at checkpoints), distributed: each record is the mean of
    the single-process losses of the steps it covers."""
    refs, out, _ = runs
    example, run_dir, _ = out[name]
    want = refs[example.replace("+log4", "")]
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    recs = [r for r in recs if "loss" in r]
    assert [r["step"] for r in recs] == [4, 8, 10, 12, 16, 20]
    last = 0
    for r in recs:
        span = range(last + 1, r["step"] + 1)
        assert r.get("steps", 1) == len(span)
        assert r["loss"] == pytest.approx(sum(want[s] for s in span) / len(span), rel=RTOL), f"{name} step {r['step']}"
        last = r["step"]


@pytest.mark.parametrize("name", [*LAYOUTS_2, *LAYOUTS_4, *BF16, "resume_pp", "resume_tp", "resume_from_single",
                                  "planned_savings"])
def test_predicted_memory_is_what_ranks_allocate(runs, name):
    _, out, _ = runs
    _, run_dir, plan = out[name]
    measured = json.loads((run_dir / "measured.json").read_text())
    for dev, real in zip(plan.doc["devices"], measured):
        for key in ("params_bytes", "grads_bytes", "optimizer_bytes"):
            assert dev["memory"][key] == real[key], f"{name} rank {dev['rank']} {key}"


@pytest.mark.parametrize("name", list(BF16))
def test_bf16_trains_close_to_float32(runs, name):
    refs, out, _ = runs
    example, run_dir, plan = out[name]
    assert plan.doc["mixed_precision"] == "bf16" and plan.doc["checkpoint"] == []
    got, want = losses(run_dir), refs[example]
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):  # bf16 keeps about 3 significant digits
        assert got[step] == pytest.approx(want[step], rel=5e-2), f"{name} step {step}"
    assert any(got[s] != want[s] for s in got)  # it really ran in bf16


@pytest.mark.parametrize("name, batch", [("tp_sequence", 32), ("pp_x_tp_sequence", 16)])
def test_sequence_parallel_norms_hold_half_the_tokens(runs, name, batch):
    """What each rank really computed (forward hooks): the norms and the layers
    handing them Shard(1) hold 8 of the 16 tokens, the column-wise layers half the
    features of all tokens, and the pooled output is whole again."""
    _, out, _ = runs
    _, run_dir, plan = out[name]
    measured = json.loads((run_dir / "measured.json").read_text())
    want = {"pos": [batch, 8, 64], "ln1": [batch, 8, 64], "attn": [batch, 8, 64], "ln2": [batch, 8, 64],
            "fc_in": [batch, 16, 64], "fc_out": [batch, 8, 64], "ln_f": [batch, 8, 64], "pool": [batch, 64]}
    for dev, real in zip(plan.doc["devices"], measured):
        held = {n: real["shapes"][n] for n in want if n in real["shapes"]}
        assert set(held) == set(want) & set(plan.doc["stages"][dev["stage"]]), f"rank {dev['rank']}"
        assert held == {n: want[n] for n in held}, f"rank {dev['rank']}"
    assert {c["op"] for c in plan.doc["communication"] if c["group"] == "tp"} == {"all-gather", "reduce-scatter",
                                                                                  "all-reduce"}


def test_tp_on_auto_is_megatrons_pair_and_trains_as_one_process(runs):
    """The layout the 'tp' run trained with (its losses match one process above) was chosen
    by the planner for nodes left on auto."""
    plan = runs[1]["tp"][2]
    assert {n: e["style"] for n, e in plan.doc["tp_plan"].items()} == MLP_TP
    assert plan.doc["tp_auto"] == sorted(MLP_TP)


def test_checkpointed_layers_are_in_the_plan(runs):
    assert runs[1]["fsdp"][2].doc["checkpoint"] == ["fc2"]


@pytest.mark.parametrize("name", ["resume_pp", "resume_tp", "resume_from_single"])
def test_checkpoint_resumes_under_another_layout(runs, name):
    """dp=2 (DDP) -> pp=2, dp=2 -> tp=2, one process -> FSDP2 dp=2, from step 10."""
    refs, out, _ = runs
    got = losses(out[name][1])
    assert sorted(got) == list(range(1, STEPS + 1))  # steps 1-10 kept from the first run, 11-20 resumed
    for step in range(11, STEPS + 1):
        assert got[step] == pytest.approx(refs["mlp_digits"][step], rel=RTOL), f"{name} step {step}"


def test_dp2_checkpoint_resumes_in_one_process(runs):
    from engine.runtime.plan import RunPlan
    from engine.runtime.spec import RunSpec
    from engine.runtime.train import run

    refs, out, tmp = runs
    d = tmp / "resume_single"
    shutil.copytree(out["ddp"][1], d, ignore=shutil.ignore_patterns("model.pt"))
    (d / "checkpoints" / "latest").write_text("step_10")
    spec = RunSpec.load(d)
    spec.plan = RunPlan()  # one process
    spec.save(d)
    run(d, resume=True)
    got = losses(d)
    for step in range(11, STEPS + 1):
        assert got[step] == pytest.approx(refs["mlp_digits"][step], rel=RTOL), step


def test_final_model_is_the_whole_model(runs):
    import torch

    from engine.diagram.compile import compile_graph

    _, out, _ = runs
    whole = compile_graph(_project("resnet_synthetic").graph).build().state_dict()
    sd_pp = torch.load(out["pp_1f1b"][1] / "model.pt", weights_only=True)
    assert {k: tuple(v.shape) for k, v in sd_pp.items()} == {k: tuple(v.shape) for k, v in whole.items()}
    sd_tp = torch.load(out["tp_attention"][1] / "model.pt", weights_only=True)
    assert sd_tp["attn.q.weight"].shape == (64, 64)  # gathered from its two column shards


def test_clipping_acts_in_the_references(runs):
    refs = runs[0]
    assert refs["mlp_digits+clip"][5] != refs["mlp_digits"][5]  # Adam undoes most of a uniform scale
    assert refs["resnet_synthetic+clip"][5] != pytest.approx(refs["resnet_synthetic"][5], rel=1e-3)  # SGD does not
