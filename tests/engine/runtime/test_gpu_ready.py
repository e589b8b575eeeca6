"""Issue 57 ("ready for the first GPU"): what a GPU would show and the CPU tests did not,
checked here where the CPU allows (real trainers, real torchrun/gloo processes; a GPU's
own behaviour, such as queued kernels or nvidia-smi, is stood in for only where named)."""
import time

import pytest


def test_a_log_steps_time_includes_the_device_work_still_queued(tmp_path, monkeypatch):
    """loop.MetricLogger reads the clock after waiting for the device: on a GPU the steps
    only queue their kernels, and a clock read before the log step's sync leaves their run
    time out (samples_per_s inflated). The GPU's queue is stood in for by a wait of 0.2 s."""
    from test_compile_runtime import mlp, train

    from engine.runtime import loop

    waits = []

    def queued_work(device):  # (a CUDA stream with 0.2 s of kernels still to run)
        waits.append(str(device))
        time.sleep(0.2)

    monkeypatch.setattr(loop, "wait_for_device", queued_work)
    _, recs, _ = train(mlp("off", steps=3), tmp_path / "run")
    logged = [r for r in recs if "samples_per_s" in r]
    assert len(logged) == 3 and waits == ["cpu"] * 3
    for r in logged:  # 32 samples a step, each step at least 0.2 s
        assert r["samples_per_s"] <= 32 / 0.2, r


def test_wait_for_device_on_the_cpu_returns():
    from engine.runtime.loop import wait_for_device

    wait_for_device("cpu")
    wait_for_device(None)


# ----- one torchrun launch (2 processes, gloo) for the distributed trainer's findings --------
import json  # noqa: E402
import math  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
WORKER = Path(__file__).with_name("_gpu_ready_worker.py")
RTOL = 1e-4
VAL = 40  # 200 samples, a fifth for validation: batches of 32 and 8, so rank 1's share of the second is empty


def _mlp(steps=6, **training):
    from test_compile_runtime import mlp

    return mlp("off", steps=steps, dataset={"kind": "synthetic_classification", "n_samples": 200},
               eval_interval=3, **training)


def _wide(width=2048, layers=4):
    """An MLP of `layers` Linear(width, width): 16 MiB a weight at 2048, 64 MiB in all."""
    from engine.diagram.graph import Graph
    from engine.project import Project
    from engine.project import Training

    g = Graph()
    g.add_node("Input", {"shape": [32]}, id="x")
    g.add_node("Linear", {"out_features": width}, id="fc0")
    prev = "fc0"
    g.connect("x", "out", "fc0", "in")
    for i in range(1, layers + 1):
        g.add_node("Linear", {"out_features": width}, id=f"fc{i}")
        g.connect(prev, "out", f"fc{i}", "in")
        prev = f"fc{i}"
    g.add_node("Linear", {"out_features": 4}, id="head")
    g.add_node("Output", {"loss": "cross_entropy"}, id="out")
    g.connect(prev, "out", "head", "in")
    g.connect("head", "out", "out", "in")
    tr = Training.model_validate({"dataset": {"kind": "synthetic_classification", "n_samples": 80},
                                  "optimizer": {"name": "sgd", "lr": 0.01}, "batch_size": 16, "steps": 1,
                                  "eval_interval": 100, "checkpoint_interval": 100, "log_interval": 1})
    return Project(g, name="wide", training=tr)


def _losses(rd: Path) -> list[float]:
    from engine.runs.tail import read_metrics

    return [r["loss"] for r in read_metrics(rd / "metrics.jsonl") if "loss" in r]


def _val(rd: Path) -> list[float]:
    from engine.runs.tail import read_metrics

    return [r["val_loss"] for r in read_metrics(rd / "metrics.jsonl") if "val_loss" in r]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    from engine.planning.planner import make_plan
    from engine.runs.build import prepare_run
    from engine.runtime.train import run

    tmp = tmp_path_factory.mktemp("gpu_ready")
    ref = prepare_run(_mlp(grad_clip=0.05), tmp / "ref")
    assert run(ref).state == "succeeded"
    dirs, jobs = {"ref": ref}, []

    def add(name, project, placement, rss=False, **plan_changes):
        plan = make_plan(project, 2, placement=placement)
        assert plan.ok, plan.errors
        rp = {**plan.runtime_plan(), **plan_changes}
        dirs[name] = prepare_run(project, tmp / name, placement=placement, plan=rp)
        jobs.append({"run_dir": str(dirs[name]), "rss": rss})

    # FSDP2 with its state offloaded to the host, and gradient clipping tight enough to act every step
    add("offload_clip", _mlp(grad_clip=0.05), {"dp": 2, "data_parallel": "fsdp"}, cpu_offload=True)
    add("pp_clip", _mlp(grad_clip=0.05), {"pp": 2, "microbatches": 2, "schedule": "1f1b"})
    add("wide", _wide(), {"dp": 2, "data_parallel": "fsdp"}, rss=True)
    spec = tmp / "jobs.json"
    spec.write_text(json.dumps(jobs))
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        str(WORKER), str(spec)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    if r.returncode:
        logs = "\n".join(f"--- {p}\n{p.read_text()[-2000:]}" for d in dirs.values() for p in sorted(d.glob("logs/rank*.log")))
        pytest.fail(f"torchrun failed ({r.returncode}):\n{r.stderr[-4000:]}\n{logs}")
    return dirs


@pytest.mark.slow
@pytest.mark.xdist_group("torchrun")
def test_cpu_offload_with_grad_clip_trains_as_one_process(launched):
    """FSDP2 cpu_offload + grad_clip: the norm summed per device group and the coefficient
    applied on each group's device (as torch's clip_grad_norm_), losses those of one process.
    (On the CPU every group is the host's: the GPU case, a device norm and host gradients,
    is the same code with two groups.)"""
    want = _losses(launched["ref"])
    for name in ("offload_clip", "pp_clip"):
        got = _losses(launched[name])
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert a == pytest.approx(b, rel=RTOL), (name, got, want)


@pytest.mark.slow
@pytest.mark.xdist_group("torchrun")
def test_each_replica_evaluates_its_share_and_the_sums_are_added(launched):
    """Under dp=2 each replica runs half the validation rows (before: all of them, on each),
    an empty share still joins FSDP's all-gathers (one padded row, dropped), and the
    validation loss is the one process's."""
    want = _val(launched["ref"])
    got = _val(launched["offload_clip"])
    assert len(got) == len(want) == 2
    for a, b in zip(got, want):
        assert a == pytest.approx(b, rel=RTOL), (got, want)
    ranks = json.loads((launched["offload_clip"] / "gpu_ready.json").read_text())
    rows = [r["eval_rows"] for r in ranks]
    assert rows == [16 + 8, 16 + 1], rows  # batches of 32 and 8: rank 1's second share is empty (1 padded row)
    assert all(math.isclose(r["eval"]["val_loss"], want[-1], rel_tol=RTOL) for r in ranks)
    pp = json.loads((launched["pp_clip"] / "gpu_ready.json").read_text())
    assert pp[0]["eval"]["val_loss"] == pytest.approx(want[-1], rel=RTOL)


@pytest.mark.slow
@pytest.mark.xdist_group("torchrun")
def test_save_final_gathers_once_to_one_rank(launched):
    """model.pt is the whole model (FSDP's shards and a pipeline's stages gathered) equal to
    one process's; while full_model_state runs, the rank that does not write holds about one
    whole tensor at a time (16 MiB of a 64 MiB model) and the writer about the model once,
    where the gather it replaced held world x model bytes on every rank."""
    import torch

    want = torch.load(launched["ref"] / "model.pt", weights_only=True)
    for name in ("offload_clip", "pp_clip"):
        got = torch.load(launched[name] / "model.pt", weights_only=True)
        assert sorted(got) == sorted(want), name
        for k in want:
            assert torch.allclose(got[k], want[k], rtol=1e-3, atol=1e-5), (name, k)
    ranks = json.loads((launched["wide"] / "gpu_ready.json").read_text())
    model = ranks[0]["model_mb"]
    assert 60 < model < 70, ranks
    print("save_final host memory rise per rank (MiB):", [(r["final_rss_mb"], r["old_rss_mb"]) for r in ranks])
    assert ranks[1]["final_rss_mb"] < 0.5 * model, ranks
    assert ranks[0]["final_rss_mb"] < 1.5 * model, ranks
    assert all(r["old_rss_mb"] > 1.5 * model for r in ranks), ranks  # (what the old gather cost, measured)


def test_the_loss_is_computed_in_float32_from_bf16_outputs():
    """FSDP's bf16 policy hands the loss bf16 outputs (no autocast there): compute_loss lifts
    them to float32 and leaves MSE/BCE targets in float32 (before: the loss in bf16, the
    targets rounded to 8 bits of mantissa)."""
    import torch
    import torch.nn.functional as F

    from engine.runtime.steps import compute_loss, eval_sums

    g = torch.Generator().manual_seed(0)
    out = torch.randn(64, 3, generator=g).bfloat16()
    y = out.float() + 1e-3 * torch.randn(64, 3, generator=g)  # closer than bf16 can tell apart
    loss = compute_loss("mse", out, y)
    assert loss.dtype == torch.float32
    assert torch.equal(loss, F.mse_loss(out.float(), y))
    assert float(loss) == pytest.approx(1e-6, rel=0.3)  # (bf16 targets: mostly 0, or a bf16 step's square)
    labels = (torch.rand(64, 3, generator=g) > 0.5).float()
    assert compute_loss("bce", out, labels).dtype == torch.float32
    cls = torch.randint(0, 3, (64,), generator=g)
    ce = compute_loss("cross_entropy", out, cls)
    assert ce.dtype == torch.float32 and torch.equal(ce, F.cross_entropy(out.float(), cls))
    assert eval_sums("mse", out, y)[0] == pytest.approx(float(loss) * 64)
    # float64 stays float64
    assert compute_loss("mse", out.double(), y.double()).dtype == torch.float64


def test_tf32_is_set_for_a_gpu_and_the_cpu_stays_float32(monkeypatch):
    """set_matmul_precision (called where the runtime picks its device: train.pick_device,
    mesh.init_distributed) turns TF32 on for a CUDA device and leaves the CPU's float32 exact.
    (torch sets the flag without a GPU; what it does to the kernels is a GPU's.)"""
    import torch

    from engine.runtime.steps import set_matmul_precision
    from engine.runtime.train import pick_device

    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert pick_device().type == "cpu" and torch.get_float32_matmul_precision() == "highest"
        set_matmul_precision(torch.device("cuda", 0))
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)


def test_the_device_table_has_one_rate_per_precision():
    """float32 on a GPU is priced at its TF32 rate (half of bf16's), not at the bf16 peak, and
    the planner prices a plan at its precision's rate."""
    from test_compile_runtime import mlp

    from engine.planning.cost import GPUS
    from engine.planning.planner import make_plan

    for name, dev in GPUS.items():
        fp32, bf16 = dev.at_precision("none").flops_per_s, dev.at_precision("bf16").flops_per_s
        assert fp32 == pytest.approx(bf16 / 2, rel=0.01), name
        assert dev.at_precision("float8").flops_per_s == bf16 and dev.flops_per_s == bf16
    h100 = GPUS["h100-80gb"]
    assert h100.at_precision("none").flops_per_s == pytest.approx(0.4 * 494.7e12)
    plans = {}
    for mp in ("none", "bf16"):
        p = mlp("off")
        p.placement.mixed_precision = mp
        plans[mp] = make_plan(p, 1, h100)
        assert plans[mp].ok, plans[mp].errors
    assert plans["none"].device.flops_per_s == pytest.approx(plans["bf16"].device.flops_per_s / 2, rel=0.01)
    assert plans["none"].predicted.step_s > plans["bf16"].predicted.step_s


def test_the_runtime_sets_the_socket_interfaces_from_the_rendezvous_address():
    """Several nodes: GLOO/NCCL_SOCKET_IFNAME name the interface that reaches the rendezvous
    address (the profile's env wins); one node: left alone."""
    from engine.runtime.distributed.mesh import set_socket_ifname, socket_ifname

    assert socket_ifname("127.0.0.1") == "lo" and socket_ifname("name.invalid") is None
    env = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "LAYERFLOW_RDZV_ENDPOINT": "127.0.0.2:29400"}
    assert set_socket_ifname(env).startswith("network interface lo (reaches the rendezvous address 127.0.0.2)")
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "lo"
    env = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "LAYERFLOW_RDZV_ENDPOINT": "127.0.0.2:29400",
           "NCCL_SOCKET_IFNAME": "^docker,veth"}  # (NCCL's own list syntax: kept, not given to gloo)
    set_socket_ifname(env)
    assert env["NCCL_SOCKET_IFNAME"] == "^docker,veth" and env["GLOO_SOCKET_IFNAME"] == "lo"
    env = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "ib0"}
    assert "from the profile's env" in set_socket_ifname(env) and env["GLOO_SOCKET_IFNAME"] == "ib0"
    # a host name that its own node maps to loopback is no answer (the other nodes reach it elsewhere)
    env = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "LAYERFLOW_RDZV_ENDPOINT": "localhost:29400"}
    assert set_socket_ifname(env).startswith("no network interface found") and "GLOO_SOCKET_IFNAME" not in env
    assert set_socket_ifname({"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}) is None


@pytest.mark.slow
@pytest.mark.xdist_group("torchrun")
def test_two_torchrun_nodes_bind_gloo_to_the_rendezvous_interface(tmp_path):
    """Two real torchrun agents (--nnodes 2, c10d rendezvous on 127.0.0.1): each worker reads
    its agent's --rdzv-endpoint, sets GLOO_SOCKET_IFNAME=lo before its process group, and
    an all-reduce over gloo runs."""
    import socket

    script = tmp_path / "w.py"
    script.write_text(f"""import json, os, sys
sys.path.insert(0, {str(ROOT)!r})
import torch, torch.distributed as dist
from engine.runtime.distributed.mesh import init_distributed
init_distributed()
t = torch.ones(1); dist.all_reduce(t)
json.dump({{k: os.environ.get(k) for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}} | {{"sum": t.item()}},
          open({str(tmp_path)!r} + "/rank%s.json" % os.environ["RANK"], "w"))
dist.destroy_process_group()
""")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "ifname", str(script)]
    agents = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
              for _ in range(2)]
    outs = [a.communicate(timeout=300)[0] for a in agents]
    assert all(a.returncode == 0 for a in agents), outs
    for r in (0, 1):
        got = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert got == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo", "sum": 2.0}, got
    assert any("layerflow: network interface lo (reaches the rendezvous address 127.0.0.1)" in o for o in outs), outs


def test_fsdp_with_cpu_offload_wraps_at_dp_1():
    """FSDP2's CPU offload is a memory saving on one device too: parallelize() wraps at dp=1
    when the plan offloads (before: dropped without a word); nothing else changes at dp=1."""
    from engine.runtime.distributed.data_parallel import wraps_dp
    from engine.runtime.plan import RunPlan

    def plan(**kw):
        return RunPlan.from_json({"pp": 1, "dp": 1, "tp": 1, **kw}, "plan")

    assert wraps_dp(plan(data_parallel="fsdp", cpu_offload=True))
    assert not wraps_dp(plan(data_parallel="fsdp")) and not wraps_dp(plan(data_parallel="ddp"))
    assert wraps_dp(plan(dp=2, data_parallel="ddp"))
    assert not wraps_dp(plan(pp=2, dp=2, data_parallel="ddp", stages=[["a"], ["b"]]))  # (a pipeline's DDP: by hand)


def test_each_record_has_its_own_steps_peak_memory(tmp_path, monkeypatch):
    """The peak counter is reset when the steps start (after compiling, a resume's load) and
    after each record, so a record's peak_mem_mb is its own steps'; the run's highest is
    kept. A GPU's counters (max_memory_allocated, reset_peak_memory_stats) are stood in for:
    the first window peaks at 500 MB (a compile, say), the steps at 100."""
    from test_compile_runtime import mlp, train

    from engine.runtime import loop

    peak = {"mb": 500.0, "resets": 0}

    def reset(device):
        peak["resets"] += 1
        peak["mb"] = 100.0

    monkeypatch.setattr(loop, "peak_mem_mb", lambda device: peak["mb"])
    monkeypatch.setattr(loop, "reset_peak_mem", reset)
    _, recs, _ = train(mlp("off", steps=3), tmp_path / "run")
    assert [r["peak_mem_mb"] for r in recs if "loss" in r] == [100.0] * 3  # (reset before the first step)
    assert peak["resets"] == 1 + 3


def test_evaluation_autocasts_as_training_does(tmp_path):
    """A bf16 run evaluates in bf16 too (before: float32 weights and activations in
    evaluation, twice the activation memory of training's); the loss stays float32."""
    import torch

    from test_compile_runtime import mlp

    from engine.runs.build import prepare_run
    from engine.runtime.spec import RunSpec
    from engine.runtime.trainer import Trainer

    p = mlp("off", steps=2)
    p.placement.mixed_precision = "bf16"
    rd = prepare_run(p, tmp_path / "run")
    t = Trainer(rd, RunSpec.load(rd), torch.device("cpu"))
    seen = []
    t.model.fc1.register_forward_hook(lambda _m, _a, out: seen.append(out.dtype))
    rec = t.evaluate()
    assert seen and set(seen) == {torch.bfloat16} and isinstance(rec["val_loss"], float)


def test_npz_batches_are_the_same_rows_pinned_or_not():
    """A GPU run gathers npz batches into pinned memory (batches.Batches pin_memory); without
    CUDA the flag is off and the rows are the plain gather's. (Pinning itself needs a GPU.)"""
    import numpy as np
    import torch

    from engine.runtime.batches import Batches

    x, y = np.arange(200, dtype=np.float32).reshape(100, 2), np.arange(100)
    plain, pinned = Batches(x, y, 10, 3), Batches(x, y, 10, 3, pin_memory=True)
    assert pinned.pin == torch.cuda.is_available()
    for step in (0, 9, 10, 23):
        (a, b), (c, d) = plain.batch(step), pinned.batch(step)
        assert torch.equal(a, c) and torch.equal(b, d) and c.is_pinned() == pinned.pin


def test_a_checkpointed_region_calls_the_sync_batchnorm_swapped_after_the_cut(tmp_path):
    """convert_sync_batchnorm (parallelize() runs it after the cut) replaces a stage's
    BatchNorm children; a checkpointed region holding one must call the SyncBatchNormCPU
    (a real gloo group of one process here), not the BatchNorm it was cut with."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from engine.runtime.distributed.stages import apply_checkpointing
    from engine.runtime.sync_bn import SyncBatchNormCPU, convert_sync_batchnorm

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn, self.head = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Linear(4, 2)

        def forward(self, x):
            return self.head(torch.relu(self.bn(self.conv(x))).mean((2, 3)))

    gm = torch.fx.symbolic_trace(Net())
    ids = [n.name for n in gm.graph.nodes if n.op in ("call_module", "call_function", "call_method")]
    stage = apply_checkpointing(gm, {"conv", "bn", "relu"})
    assert hasattr(stage, "checkpointed_0") and "mean" in ids
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        stage = convert_sync_batchnorm(stage, dist.group.WORLD, "cpu")
        assert isinstance(stage.bn, SyncBatchNormCPU)
        calls = []
        stage.bn.register_forward_hook(lambda *_a: calls.append(1))
        stage(torch.randn(2, 3, 8, 8)).sum().backward()
        assert calls and stage.bn.weight.grad is not None and int(stage.bn.num_batches_tracked) >= 1
    finally:
        dist.destroy_process_group()
