"""Runs several distributed layouts in ONE torchrun launch (process start costs
seconds on 2 cores; a layout costs a fraction of one).

    torchrun --nproc-per-node N tests/engine/runtime/_dist_worker.py JOBS.json

JOBS.json: a list of {"run_dir": ..., "resume": bool, "copy_from": {"src": DIR,
"step": N} (optional), "plan": {...} (optional: replaces run.json's plan)}.
Each job trains with the product's own ParallelTrainer and fit loop, then every
rank reports what it really allocates (parameters, gradients, optimizer state)
and each layer's local output shape into RUN_DIR/measured.json, for the planner's
exact-memory test and the sequence-parallel test.
"""
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from engine.runtime.loop import fit  # noqa: E402
from engine.runtime.parallel_trainer import ParallelTrainer  # noqa: E402
from engine.runtime.distributed.pipeline import by_node_id
from engine.runtime.distributed.mesh import init_distributed
from engine.runtime.plan import RunPlan  # noqa: E402
from engine.runtime.spec import RunSpec  # noqa: E402
from engine.runtime.steps import seed_all  # noqa: E402


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def measured(trainer) -> dict:
    params = [p for p in trainer.model.parameters()]
    state = [v for st in trainer.opt.state.values() for v in st.values() if torch.is_tensor(v)]
    return {
        "params_bytes": sum(_local(p).numel() * p.element_size() for p in params),
        "grads_bytes": sum(_local(p.grad).numel() * p.grad.element_size() for p in params if p.grad is not None),
        "optimizer_bytes": sum(_local(v).numel() * v.element_size() for v in state),
    }


def main() -> None:
    jobs = json.loads(Path(sys.argv[1]).read_text())
    device = init_distributed()
    rank = dist.get_rank()
    for job in jobs:
        run_dir = Path(job["run_dir"])
        if rank == 0:
            if job.get("copy_from"):
                src = Path(job["copy_from"]["src"])
                shutil.rmtree(run_dir, ignore_errors=True)
                shutil.copytree(src, run_dir, ignore=shutil.ignore_patterns("model.pt", "measured.json"))
                (run_dir / "checkpoints" / "latest").write_text(f"step_{job['copy_from']['step']}")
            if "plan" in job:
                spec = RunSpec.load(run_dir)
                spec.plan = RunPlan.from_json(job["plan"])
                spec.save(run_dir)
        dist.barrier()
        spec = RunSpec.load(run_dir)
        seed_all(spec.training.seed)
        (run_dir / "logs").mkdir(exist_ok=True)
        with open(run_dir / "logs" / f"rank{rank}.log", "a") as logf:
            trainer = ParallelTrainer(run_dir, spec, device)
            fit(trainer, run_dir, resume=bool(job.get("resume")), writes_metrics=rank == 0,
                log=lambda m: logf.write(m + "\n"))
        shapes = {}  # each layer's local output in that step: what TP / sequence parallelism really cut

        def record(name):
            def hook(mod, args, out):  # returns None: the output is left as it is
                if hasattr(out, "shape"):  # (a checkpointed region hands on a tuple: its layers are not timed apart)
                    shapes.setdefault(name, list(_local(out).shape))
            return hook
        hooks = [m.register_forward_hook(record(name)) for name, m in by_node_id(trainer.parts).named_children()]
        trainer.train_step(0)  # one more step, so gradients are held right now
        for h in hooks:
            h.remove()
        mine = {**measured(trainer), "shapes": shapes}
        allm = [None] * dist.get_world_size()
        dist.all_gather_object(allm, mine)
        if rank == 0:
            (run_dir / "measured.json").write_text(json.dumps(allm))
        del trainer
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
    from engine.runtime.train import _exit_now

    _exit_now(0)  # as the runtime ends under torchrun: no interpreter teardown racing gloo's threads
