"""Layerflow's distributed runtime against a hand-written torch.distributed script.

    python bench/dist_overhead.py [--hidden 1024] [--batch 256] [--steps 60] [--repeats 2]

Same model (an MLP: 256 -> H -> H -> 10), same seed, same data batches, same
optimizer, both under torchrun with gloo on this machine's CPUs:
  1. DDP on 2 processes
  2. 1F1B pipeline with 2 stages (4 micro-batches)
Layerflow runs through the product path (prepare_run with the planner's plan ->
remote.launch.local -> engine.runtime.train); the hand-written script is what a
person would write with DDP / PipelineStage + Schedule1F1B by hand. Prints the
throughput ratio (goal >= 0.95), the planner's predicted step time against the
measured one, and predicted tensor memory against each rank's measured peak RSS
(RSS includes the torch runtime itself: the baseline column is a rank's RSS just
before the model is built). Not a test: timings depend on the machine's load.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WARMUP = 10


# ----- the hand-written script (runs under torchrun: --worker) -------------------------
def _rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(kind: str, run_dir: Path, out: Path) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn

    from engine.runtime.batches import Batches, load_npz

    torch.set_num_threads(1)
    cuda = torch.cuda.is_available()  # bench/gpu_check.py runs this same script on GPUs
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    if cuda:
        dist.init_process_group("nccl", device_id=dev)
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    base = _rss_mb()
    spec = json.loads((run_dir / "run.json").read_text())
    tr = spec["training"]
    H = spec["model"]["nodes"][1]["params"]["out_features"]
    n_in = spec["model"]["nodes"][0]["params"]["shape"][0]
    torch.manual_seed(tr["seed"])
    model = nn.Sequential(nn.Linear(n_in, H), nn.ReLU(), nn.Linear(H, H), nn.ReLU(), nn.Linear(H, 10))
    arrays = load_npz(run_dir)
    B, steps = tr["batch_size"], spec["total_steps"]
    batches = Batches(arrays["x_train"], arrays["y_train"], B, tr["seed"])
    model.to(dev)
    times, losses = [], []

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    if kind in ("ddp", "tp"):
        if kind == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            model = DDP(model, gradient_as_bucket_view=True)
            per, lo = B // world, rank * (B // world)
        else:  # Megatron MLP: fc1 column-wise, fc2 row-wise, head replicated
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            mesh = init_device_mesh(dev.type, (world,))
            parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
            per, lo = B, 0
        opt = torch.optim.Adam(model.parameters(), lr=tr["optimizer"]["lr"])
        for step in range(steps):
            t0 = time.perf_counter()
            x, y = batches.batch(step)
            x, y = x[lo:lo + per].to(dev), y[lo:lo + per].to(dev)
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            sync()
            times.append(time.perf_counter() - t0)
    else:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B

        part = model[:3] if rank == 0 else model[3:]  # the same cut as the Layerflow plan
        stage = PipelineStage(part, rank, world, dev)
        sched = Schedule1F1B(stage, 4, loss_fn=F.cross_entropy)
        opt = torch.optim.Adam(part.parameters(), lr=tr["optimizer"]["lr"])
        for step in range(steps):
            t0 = time.perf_counter()
            x, y = batches.batch(step)
            x, y = x.to(dev), y.to(dev)
            opt.zero_grad(set_to_none=True)
            mb_losses: list = []
            if rank == 0:
                sched.step(x)
            else:
                sched.step(target=y, losses=mb_losses)
                losses.append(torch.stack(mb_losses).mean().item())
            opt.step()
            sync()
            times.append(time.perf_counter() - t0)
    res = {"rank": rank, "times": times, "losses": losses, "peak_rss_mb": _rss_mb(), "baseline_rss_mb": base,
           "peak_cuda_mb": torch.cuda.max_memory_allocated(dev) / 2**20 if cuda else None}
    allr: list = [None] * world
    dist.all_gather_object(allr, res)
    if rank == 0:
        out.write_text(json.dumps(allr))
    dist.destroy_process_group()


# ----- the driver ----------------------------------------------------------------------
def project(hidden: int, batch: int, steps: int, pp: bool):
    from engine.diagram.graph import Graph
    from engine.project import Optimizer, Project, Training
    from engine.data.sources import SyntheticClassification

    g = Graph()
    g.add_node("Input", {"shape": [256]}, id="x")
    prev = "x"
    for nid, typ, params in [("fc1", "Linear", {"out_features": hidden}), ("act1", "ReLU", {}),
                             ("fc2", "Linear", {"out_features": hidden}), ("act2", "ReLU", {}),
                             ("head", "Linear", {"out_features": 10})]:
        g.add_node(typ, params, id=nid, stage=(0 if nid in ("fc1", "act1", "fc2") else 1) if pp else None)
        g.connect(prev, "out", nid, "in")
        prev = nid
    g.add_node("Output", {"loss": "cross_entropy"}, id="out")
    g.connect(prev, "out", "out", "in")
    tr = Training(dataset=SyntheticClassification(kind="synthetic_classification", n_samples=max(4096, batch * 8),
                                                   n_features=256, n_classes=10, noise=4.0),
                  batch_size=batch, steps=steps, eval_interval=steps, checkpoint_interval=steps,
                  optimizer=Optimizer(name="adam", lr=1e-3))
    return Project(g, name="bench_mlp", training=tr)


def layerflow_run(tmp: Path, name: str, proj, placement: dict, nproc: int = 2, device=None, styles=None) -> tuple[Path, object]:
    from engine.planning.planner import make_plan
    from engine.runs.build import prepare_run
    from remote.launch.local import launch_local

    from engine.runs import calibration

    plan = make_plan(proj, nproc, device, placement=placement, styles=styles)
    assert plan.ok, plan.errors
    calibration.apply(plan, proj, runs_dir=tmp)  # by the previous run of this layout, if any (as `plan` does)
    d = prepare_run(proj, tmp / name, placement=placement, plan=plan.runtime_plan())
    job = launch_local(d, nproc)
    if job.wait(timeout=900) != 0:
        raise SystemExit(f"Layerflow run failed: {job.describe_failure()}")
    return d, plan


def handwritten(tmp: Path, kind: str, run_dir: Path, nproc: int = 2) -> list[dict]:
    out = tmp / f"hand_{kind}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                    __file__, "--worker", kind, str(run_dir), str(out)], cwd=ROOT, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def layerflow_times(run_dir: Path, batch: int) -> tuple[list[float], list[dict]]:
    """Step times after the warm-up (each record's: batch / samples_per_s, the mean over
    the steps it covers, evaluations left out) and the loss records."""
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    recs = [r for r in recs if "loss" in r]
    return [batch / r["samples_per_s"] for r in recs if r["step"] > WARMUP], recs


def loss_diff(recs: list[dict], hand: list[float]) -> float:
    """Largest relative difference of a record's loss from the mean of the hand-written
    losses of the steps it covers."""
    out = 0.0
    for r in recs:
        span = hand[r["step"] - r.get("steps", 1): r["step"]]
        want = sum(span) / len(span)
        out = max(out, abs(r["loss"] - want) / max(abs(want), 1e-12))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--worker", nargs=3, metavar=("KIND", "RUN_DIR", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker[0], Path(args.worker[1]), Path(args.worker[2]))
        return 0
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rows = []
    with tempfile.TemporaryDirectory(prefix="lf_dist_bench_") as tmpdir:
        tmp = Path(tmpdir)
        for kind, placement in (("ddp", {"dp": 2, "data_parallel": "ddp"}),
                                ("1f1b", {"pp": 2, "schedule": "1f1b", "microbatches": 4})):
            proj = project(args.hidden, args.batch, args.steps, pp=kind == "1f1b")
            lf_meds, hd_meds, calibrated = [], [], []
            for rep in range(args.repeats):  # alternate the two, keep each one's best: the machine is shared
                d, plan = layerflow_run(tmp, f"{kind}{rep}", proj, placement)
                lf_dt, lf_loss = layerflow_times(d, args.batch)
                lf_meds.append(statistics.median(lf_dt))
                if rep:  # calibrated by the run before: its prediction against this run's pace
                    calibrated.append((plan.doc["predicted"].get("calibrated_step_s"), lf_meds[-1]))
                hand = handwritten(tmp, "ddp" if kind == "ddp" else "pp", d)
                hand_dt = hand[0]["times"]  # rank 0's step periods, as Layerflow's are timed on rank 0
                hd_meds.append(statistics.median(hand_dt[WARMUP:]))
            with_loss = [r["losses"] for r in hand if r["losses"]]  # DDP: each replica's half; PP: last stage
            hand_loss = [sum(v) / len(v) for v in zip(*with_loss)]
            lf_med, hd_med = min(lf_meds), min(hd_meds)
            peaks = json.loads((d / "peak_mem_per_rank.json").read_text())
            rows.append({
                "config": f"{kind} x2", "lf_sps": args.batch / lf_med, "hand_sps": args.batch / hd_med,
                "ratio": hd_med / lf_med, "pred_ms": plan.doc["predicted"]["step_s"] * 1e3, "meas_ms": lf_med * 1e3,
                "pred": plan.doc["predicted"], "device": plan.doc["device"],
                "loss_diff": loss_diff(lf_loss, hand_loss),
                "calibrated": calibrated,
                "mem": [(dv["memory"]["total_bytes"] / 2**20, peaks[dv["rank"]], hand[dv["rank"]]["baseline_rss_mb"])
                        for dv in plan.doc["devices"]],
            })
    print(f"MLP 256-{args.hidden}-{args.hidden}-10, global batch {args.batch}, {args.steps} steps "
          f"(median step after {WARMUP} warm-up steps, best of {args.repeats}), gloo on CPU, 2 processes")
    print(f"{'config':<9} {'Layerflow/s':>12} {'hand/s':>10} {'ratio':>6} {'pred ms':>8} {'meas ms':>8} {'pred/meas':>9} "
          f"{'calibrated/meas':>15} {'loss rel diff':>13}")
    for r in rows:
        cal = [c / m for c, m in r["calibrated"] if c]
        cal_text = " ".join(f"{v:.2f}" for v in cal) if cal else "-"
        print(f"{r['config']:<9} {r['lf_sps']:>12.0f} {r['hand_sps']:>10.0f} {r['ratio']:>6.3f} {r['pred_ms']:>8.2f} "
              f"{r['meas_ms']:>8.2f} {r['pred_ms'] / r['meas_ms']:>9.2f} {cal_text:>15} {r['loss_diff']:>13.1e}")
    print("calibrated/meas: each repeat's plan corrected by the run before it of the same layout (engine/runs/calibration.py: "
          "its first steps' pace against its prediction), over that repeat's measured step (goal: within 15%)")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    for r in rows:  # what the prediction is made of (engine/planning/cost.py step_time), on what device figures
        p, dv = r["pred"], r["device"]
        upd = f", optimizer {dv['update_bytes_per_s'] / 1e9:.2f} GB/s" if dv.get("update_bytes_per_s") else ""
        print(f"  {r['config']}: predicted = compute {p['compute_s'] * 1e3:.2f} + optimizer "
              f"{p.get('update_s', 0) * 1e3:.2f} + comm {p['comm_s'] * 1e3:.2f} ms "
              f"({dv['flops_per_s'] / 1e9:.0f} GFLOP/s{upd}, link {dv['link_bytes_per_s'] / 1e9:.1f} GB/s, "
              f"{dv['latency_s'] * 1e6:.0f} us)")
    print("\nmemory per rank: predicted tensors (params+grads+optimizer+activations) vs measured peak RSS")
    print(f"{'config':<9} {'rank':>4} {'pred MiB':>9} {'peak RSS MiB':>13} {'baseline MiB':>13} {'RSS-baseline':>13}")
    for r in rows:
        for rank, (pred, peak, base) in enumerate(r["mem"]):
            print(f"{r['config']:<9} {rank:>4} {pred:>9.1f} {peak:>13.1f} {base:>13.1f} {peak - base:>13.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
