"""Batch-dependent layers under data parallelism and pipelining, on CPU (gloo).

cnn_digits has a BatchNorm2d (bn1). With placement.sync_batchnorm its statistics
come from the whole data-parallel batch (engine/runtime/sync_bn.py on CPU), so dp=2
under DDP and FSDP2 trains to the single-process losses and running statistics;
without it each replica normalizes by its own half and the losses differ. A 2-stage
pipeline with 2 micro-batches normalizes per micro-batch: it equals one process with
training.grad_accumulation 2. One torchrun launch runs all the layouts
(tests/engine/runtime/_dist_worker.py); the exported script runs under torchrun too.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine.planning.planner import make_plan
from engine.project import load_project
from engine.runs.build import prepare_run

ROOT = Path(__file__).resolve().parents[3]
WORKER = Path(__file__).with_name("_dist_worker.py")
STEPS = 20
RTOL = 1e-4
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("torchrun")]

PP = {"pp": 2, "microbatches": 2}
# name: (placement, stages)
LAYOUTS = {
    "sync_ddp": ({"dp": 2, "data_parallel": "ddp", "sync_batchnorm": True}, None),
    "sync_fsdp": ({"dp": 2, "data_parallel": "fsdp", "sync_batchnorm": True}, None),
    "plain_ddp": ({"dp": 2, "data_parallel": "ddp"}, None),  # each replica's own statistics
    "pp": (PP, None),  # the planner cuts after pool1: bn1 in stage 0
    "pp_bn_in_stage1": (PP, [["conv1"], ["bn1", "relu1", "pool1", "conv2", "relu2", "gap", "flat", "head"]]),
}


def _project(**training):
    p = load_project(ROOT / "resources" / "examples" / "cnn_digits.lflow")
    # a bias before BatchNorm has a zero gradient up to rounding, which Adam scales into
    # full steps: the running means would follow rounding noise
    p.graph.set_param("conv1", "bias", False)
    p.training = p.training.model_copy(update={"checkpoint_interval": 10, "eval_interval": STEPS, "log_interval": 1,
                                               **training})  # every step recorded: compared step by step
    return p


def losses(run_dir: Path) -> dict[int, float]:
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in recs if "loss" in r}


def _run(cmd: list[str], cwd: Path, what: str) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if r.returncode:
        pytest.fail(f"{what} failed ({r.returncode}):\n{r.stderr[-4000:]}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from engine.runtime.train import run

    tmp = tmp_path_factory.mktemp("bn")
    refs = {}
    for name, acc in (("ref", 1), ("accumulate", 2)):
        refs[name] = prepare_run(_project(grad_accumulation=acc), tmp / name, steps=STEPS)
        run(refs[name])
    out, jobs = {}, []
    for name, (placement, stages) in LAYOUTS.items():
        plan = make_plan(_project(), 2, placement=placement, stages=stages)
        assert plan.ok, plan.errors
        out[name] = prepare_run(_project(), tmp / name, steps=STEPS, placement=placement, plan=plan.runtime_plan())
        jobs.append({"run_dir": str(out[name])})
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    _run(TORCHRUN + [str(WORKER), str(tmp / "jobs.json")], ROOT, "torchrun")
    return refs, out, tmp


def _close(got: dict, want: dict, name: str) -> None:
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert got[step] == pytest.approx(want[step], rel=RTOL), f"{name} step {step}"


def _model(run_dir: Path) -> dict:
    import torch

    return torch.load(run_dir / "model.pt", weights_only=True)


def _off(got, want) -> float:
    """Largest difference relative to the tensor's scale. After 20 Adam steps the weights
    themselves differ by up to ~3e-3 of that (Adam turns rounding in near-zero gradients
    into whole steps), the running statistics by ~2e-4."""
    return float((got.double() - want.double()).abs().max() / want.double().abs().max())


@pytest.mark.parametrize("name", ["sync_ddp", "sync_fsdp"])
def test_sync_batchnorm_trains_like_one_process(runs, name):
    refs, out, _ = runs
    _close(losses(out[name]), losses(refs["ref"]), name)
    got, want = _model(out[name]), _model(refs["ref"])
    assert set(got) == set(want)  # the same state_dict keys: checkpoints move between layouts
    assert int(got["bn1.num_batches_tracked"]) == int(want["bn1.num_batches_tracked"]) == STEPS
    for key in ("bn1.running_mean", "bn1.running_var"):
        assert _off(got[key], want[key]) < 1e-3, key


def test_without_sync_batchnorm_the_losses_differ(runs):
    refs, out, _ = runs
    got, want = losses(out["plain_ddp"]), losses(refs["ref"])
    assert max(abs(got[s] - want[s]) / want[s] for s in range(2, STEPS + 1)) > 5 * RTOL  # measured 8.6e-4
    m, w = _model(out["plain_ddp"]), _model(refs["ref"])
    assert _off(m["bn1.running_mean"], w["bn1.running_mean"]) > 1e-3  # what the test above would catch
    assert _off(m["bn1.running_var"], w["bn1.running_var"]) > 1e-3


@pytest.mark.parametrize("name", ["pp", "pp_bn_in_stage1"])
def test_pipeline_micro_batches_equal_single_process_accumulation(runs, name):
    refs, out, _ = runs
    acc, ref = losses(refs["accumulate"]), losses(refs["ref"])
    _close(losses(out[name]), acc, name)
    # the test can fail: per-micro-batch statistics are not the whole batch's
    assert max(abs(acc[s] - ref[s]) / ref[s] for s in range(2, STEPS + 1)) > 5 * RTOL  # measured 8.6e-4
    got, want = _model(out[name]), _model(refs["accumulate"])
    for key in ("conv1.weight", "bn1.weight", "bn1.bias", "conv2.weight", "head.weight"):
        assert _off(got[key], want[key]) < 1e-4, key


@pytest.mark.parametrize("name", ["pp", "pp_bn_in_stage1"])
def test_pipeline_running_statistics_equal_single_process_accumulation(runs, name):
    """PipelineStage's first call runs each stage once more to learn the shapes
    (ParallelTrainer undoes that run): BatchNorm counts only the real micro-batches,
    in stage 0 and past it (where that run fed it empty tensors)."""
    refs, out, _ = runs
    got, want = _model(out[name]), _model(refs["accumulate"])
    assert int(got["bn1.num_batches_tracked"]) == int(want["bn1.num_batches_tracked"]) == 2 * STEPS
    for key in ("bn1.running_mean", "bn1.running_var"):
        assert _off(got[key], want[key]) < 1e-3, key


def test_exported_script_synchronizes_batchnorm_on_cpu(runs):
    """The standalone script (its copy of sync_bn.py) trains dp=2 like the runtime."""
    from engine.interop import export_script

    refs, _, tmp = runs
    project = _project()
    project.placement = project.placement.derive(**LAYOUTS["sync_ddp"][0])
    script = export_script(project, tmp / "script" / "cnn.py")
    assert "class SyncBatchNormCPU(_BatchNorm):" in script.read_text()
    env_cmd = TORCHRUN + [str(script), "--steps", str(STEPS), "--out", str(tmp / "script_out")]
    _run(env_cmd, script.parent, "the exported script under torchrun")
    recs = [json.loads(line) for line in (tmp / "script_out" / "metrics.jsonl").read_text().splitlines()]
    _close({r["step"]: r["loss"] for r in recs}, losses(refs["ref"]), "script")


UNEQUAL = textwrap.dedent('''\
    import json, os, sys
    import torch, torch.distributed as dist
    sys.path.insert(0, sys.argv[1])
    from engine.runtime.sync_bn import SyncBatchNormCPU, convert_sync_batchnorm

    def net():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4, momentum=None))

    torch.manual_seed(1)
    x = torch.randn(10, 3, 5, 5) * 3 + 1
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mine = convert_sync_batchnorm(net(), None, "cpu")
    assert isinstance(mine[1], SyncBatchNormCPU)
    part = x[:3] if rank == 0 else x[3:]  # 3 and 7 samples
    one = net()
    for _ in range(2):  # loss: the mean of y**3 over the whole batch, each rank adding its part
        ((mine(part) ** 3).sum() / 1000).backward()  # the whole output: 10 x 4 x 5 x 5
        ((one(x) ** 3).mean()).backward()
    grads = [p.grad.clone() for p in mine.parameters()]
    for g in grads:
        dist.all_reduce(g)  # the replicas' gradients add up to the whole batch's
    scale = max(p.grad.abs().max() for p in one.parameters())  # the conv bias's gradient is 0 up to rounding
    res = {"out": (mine(part) - one(x)[:3] if rank == 0 else mine(part) - one(x)[3:]).abs().max().item(),
           "grads": [((g - p.grad).abs().max() / scale).item() for g, p in zip(grads, one.parameters())],
           "stats": {k: (v.double() - one.state_dict()[k].double()).abs().max().item()
                     for k, v in mine.state_dict().items()}}
    mine.eval(); one.eval()
    res["eval"] = (mine(part) - one(part)).abs().max().item()  # eval: running statistics, no collective
    if rank == 0:
        print("RESULT " + json.dumps(res), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # no interpreter teardown racing gloo's threads (as the runtime ends)
''')


def test_unequal_local_batches_give_the_whole_batch_statistics(tmp_path):
    """3 and 7 samples on two ranks: outputs, gradients and running statistics (momentum
    None: the cumulative average) equal one process's over all 10."""
    script = tmp_path / "unequal.py"
    script.write_text(UNEQUAL)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(TORCHRUN + [str(script), str(ROOT)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    res = json.loads(r.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert res["out"] < 1e-5 and res["eval"] < 1e-5
    assert max(res["grads"]) < 1e-5, res
    assert max(res["stats"].values()) < 1e-5, res["stats"]
