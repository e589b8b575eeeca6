"""A language model whose token embedding and output head share one weight (nanoGPT's
tie), cut across pipeline stages (issue 43, item 1): each stage keeps a copy, the copies'
gradients are summed every step, and the run equals one process step for step, at pp=2,
with gradient clipping, and at pp=2 x dp=2 (FSDP2, and DDP's averaging); the copies stay bit-identical; a checkpoint
written at pp=2 resumes in one process and one written in one process resumes at pp=2.
Real torchrun processes (gloo), the imported GPT of tests/models/real_models.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from real_models import GPT
from test_dist_equivalence import _torchrun as torchrun

from engine.interop import save_imported
from engine.interop.module.importer import from_module
from engine.planning.planner import make_plan
from engine.project import load_project
from engine.runs.build import prepare_run
from engine.runtime.train import run
from engine.runs.tail import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("torchrun")]

STEPS = 6
RTOL = 1e-4


def gpt_project(tmp: Path, clip: float | None = None):
    torch.manual_seed(0)
    imp = from_module(GPT().eval(), [[16]], ["int64"])
    p = load_project(save_imported(imp, tmp / "gpt.lflow"))
    p.training.batch_size = 8
    p.training.steps = STEPS
    p.training.log_interval = 1
    p.training.eval_interval = 100
    p.training.checkpoint_interval = 3
    p.training.optimizer.name = "adamw"
    p.training.optimizer.lr = 3e-3
    p.training.grad_clip = clip
    return p


def losses(rd: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(rd / "metrics.jsonl") if "loss" in r}


def pipelined(tmp: Path, name: str, placement: dict, clip: float | None = None) -> tuple[Path, object]:
    project = gpt_project(tmp, clip)
    nproc = placement.get("pp", 1) * placement.get("dp", 1)
    plan = make_plan(project, nproc, placement=placement)
    assert plan.ok, plan.errors
    return prepare_run(project, tmp / name, steps=STEPS, placement=placement, plan=plan.runtime_plan()), plan


def test_the_automatic_cut_splits_the_tie_and_the_plan_says_what_it_costs(tmp_path):
    project = gpt_project(tmp_path)
    assert project.graph.ties == {"lm_head.weight": "transformer_wte.weight"}
    plan = make_plan(project, 2, placement={"pp": 2, "microbatches": 2})
    assert plan.ok, plan.errors
    stages = plan.runtime_plan()["stages"]
    assert "transformer_wte" in stages[0] and "lm_head" in stages[1]
    assert any("tied weights transformer_wte.weight = lm_head.weight" in n and "stages 0 and 1" in n
               for n in plan.notes), plan.notes
    tied = [c for c in plan.communication if c.op == "all-reduce" and "tied" in c.where]
    numel = 40 * 16  # GPT's vocabulary x width
    assert len(tied) == 1 and tied[0].bytes_per_step == numel * 4 and tied[0].group_size == 2, tied
    # each stage holds a copy: the predicted parameters of the two stages add to one more copy
    total = sum(p.numel() for p in GPT().parameters())
    per_stage = {x.stage: x.params for x in plan.devices}
    assert per_stage[0] + per_stage[1] == total + numel
    tp = make_plan(project, 4, placement={"pp": 2, "tp": 2, "microbatches": 2})
    assert any("with tensor parallelism (tp=2) a tie runs inside one stage only" in e for e in tp.errors), tp.errors


@pytest.fixture(scope="module")
def tied_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tied")
    out = {}
    for name, clip in (("one", None), ("one_clip", 0.05)):
        rd = prepare_run(gpt_project(tmp, clip), tmp / name, steps=STEPS)
        assert run(rd).state == "succeeded"
        out[name] = rd
    jobs2 = []
    for name, placement, clip in (("pp2", {"pp": 2, "schedule": "gpipe", "microbatches": 2}, None),
                                  ("pp2_1f1b_clip", {"pp": 2, "schedule": "1f1b", "microbatches": 4}, 0.05)):
        out[name], _ = pipelined(tmp, name, placement, clip)
        jobs2.append({"run_dir": str(out[name])})
    # resumed across layouts: pp=2's checkpoint at step 3 in one process, one process's at pp=2
    single_plan = json.loads((out["one"] / "run.json").read_text())["plan"]
    pp_plan = json.loads((out["pp2"] / "run.json").read_text())["plan"]
    jobs2.append({"run_dir": str(tmp / "resume_at_pp2"), "copy_from": {"src": str(out["one"]), "step": 3},
                  "plan": pp_plan, "resume": True})
    out["resume_at_pp2"] = tmp / "resume_at_pp2"
    torchrun(2, jobs2, tmp)
    out["pp2x2"], _ = pipelined(tmp, "pp2x2", {"pp": 2, "dp": 2, "microbatches": 2, "data_parallel": "fsdp"})
    # (ddp in a pipeline: the stage's gradients averaged by hand, parallel.dp_by_hand)
    out["pp2x2_ddp"], _ = pipelined(tmp, "pp2x2_ddp", {"pp": 2, "dp": 2, "microbatches": 2, "data_parallel": "ddp"})
    torchrun(4, [{"run_dir": str(out["pp2x2"])}, {"run_dir": str(out["pp2x2_ddp"])}], tmp)
    # pp=2's checkpoint at step 3, resumed in one process (its run.json's plan made single)
    import shutil

    one_from_pp = tmp / "resume_in_one"
    shutil.copytree(out["pp2"], one_from_pp, ignore=shutil.ignore_patterns("model.pt", "measured.json"))
    (one_from_pp / "checkpoints" / "latest").write_text("step_3")
    spec = json.loads((one_from_pp / "run.json").read_text())
    spec["plan"] = single_plan
    (one_from_pp / "run.json").write_text(json.dumps(spec))
    assert run(one_from_pp, resume=True).state == "succeeded"
    out["resume_in_one"] = one_from_pp
    return out


@pytest.mark.parametrize("name, ref", [("pp2", "one"), ("pp2_1f1b_clip", "one_clip"), ("pp2x2", "one"),
                                       ("pp2x2_ddp", "one"), ("resume_at_pp2", "one"), ("resume_in_one", "one")])
def test_a_tied_model_across_stages_equals_one_process(tied_runs, name, ref):
    want, got = losses(tied_runs[ref]), losses(tied_runs[name])
    assert sorted(got) == list(range(1, STEPS + 1)), got
    for step in got:
        assert got[step] == pytest.approx(want[step], rel=RTOL), (name, step, got[step], want[step])


@pytest.mark.parametrize("name", ["pp2", "pp2_1f1b_clip", "pp2x2", "pp2x2_ddp"])
def test_the_copies_stay_one_weight(tied_runs, name):
    """model.pt gathers each stage's names: the embedding's (stage 0) and the head's (stage 1)
    are the same values after training, and equal one process's trained weight."""
    sd = torch.load(tied_runs[name] / "model.pt", weights_only=True)
    torch.testing.assert_close(sd["lm_head.weight"], sd["transformer_wte.weight"], rtol=0, atol=0)
    ref = torch.load(tied_runs["one_clip" if "clip" in name else "one"] / "model.pt", weights_only=True)
    torch.testing.assert_close(sd["transformer_wte.weight"], ref["transformer_wte.weight"], rtol=1e-4, atol=1e-5)


def test_auto_placement_of_a_24_block_tied_gpt_fits_and_its_proposal_runs(tmp_path):
    """Issue 43, item 5: on 4 devices of 10 MB the planner cuts the 24-block GPT into a
    pipeline (the tie split across stages), says why, and the layout it proposes trains
    on 4 torchrun processes with the losses of one process."""
    import layerflow as lf

    torch.manual_seed(0)
    imp = from_module(GPT(vocab_size=128, block_size=16, n_layer=24, n_head=2, n_embd=32).eval(), [[16]], ["int64"])
    path = save_imported(imp, tmp_path / "gpt24.lflow")
    p = lf.Project.load(path)
    p.training.batch_size = 16
    p.training.log_interval = 1
    p.training.optimizer.lr = 3e-3
    plan = p.autoplace(4, memory_gb=0.01)
    pl = p.placement
    assert plan.ok and pl.pp > 1 and pl.pp * pl.dp * pl.tp == 4, (pl, plan.errors)
    assert plan.reasons and plan.reasons[0].startswith(f"chose pp={pl.pp} x dp={pl.dp} x tp={pl.tp}"), plan.reasons
    assert any("tied weights" in n for n in plan.notes), plan.notes
    assert max(d.memory.total_bytes for d in plan.devices) <= 0.01 * 2 ** 30
    p.save(path)
    proposed = prepare_run(load_project(path), tmp_path / "auto", steps=3)
    torchrun(4, [{"run_dir": str(proposed)}], tmp_path)
    single = load_project(path)
    single.placement = single.placement.derive(pp=1, dp=1, tp=1, microbatches=None)
    for n in single.graph.nodes:
        single.graph.assign(n, stage=None, tp=None)
    one = prepare_run(single, tmp_path / "one", steps=3)
    assert run(one).state == "succeeded"
    want, got = losses(one), losses(proposed)
    assert sorted(got) == [1, 2, 3] and all(got[s] == pytest.approx(want[s], rel=RTOL) for s in want), (got, want)
