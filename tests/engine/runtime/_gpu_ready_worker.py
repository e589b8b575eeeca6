"""torchrun worker of test_gpu_ready.py (issue 57): each job trains with the product's
ParallelTrainer and fit, then every rank measures

    eval_rows      the rows its model ran in one more trainer.evaluate() (a forward hook)
    eval           that evaluation's record (the replicas' sums)
    final_rss_mb   the peak rise of its resident memory while dist_checkpoint.full_model_state
                   runs as save_final calls it ("old_rss_mb": the gather it replaced, kept here
                   only to measure it: the whole model on every rank, then all-gathered)

into RUN_DIR/gpu_ready.json (a list by rank).

    torchrun --nproc-per-node N tests/engine/runtime/_gpu_ready_worker.py JOBS.json
"""
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from engine.runtime import dist_checkpoint  # noqa: E402
from engine.runtime.distributed.mesh import init_distributed  # noqa: E402
from engine.runtime.loop import fit  # noqa: E402
from engine.runtime.parallel_trainer import ParallelTrainer  # noqa: E402
from engine.runtime.spec import RunSpec  # noqa: E402
from engine.runtime.steps import seed_all  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def peak_rise_mb(fn) -> float:
    """fn() run while a thread samples this process's resident memory every millisecond."""
    base, peak, done = rss(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.001)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out = fn()
    done.set()
    t.join()
    peak[0] = max(peak[0], rss())
    del out
    return round((peak[0] - base) / 2**20, 1)


def old_full_model_state(model):
    """What save_final did before issue 57 (measured only)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    part = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    part = {k: v.detach().cpu() for k, v in part.items()}
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, part)
    full: dict = {}
    for p in parts:
        full.update(p)
    return full


def main() -> None:
    jobs = json.loads(Path(sys.argv[1]).read_text())
    device = init_distributed()
    rank = dist.get_rank()
    for job in jobs:
        run_dir = Path(job["run_dir"])
        spec = RunSpec.load(run_dir)
        seed_all(spec.training.seed)
        (run_dir / "logs").mkdir(exist_ok=True)
        with open(run_dir / "logs" / f"rank{rank}.log", "a") as logf:
            trainer = ParallelTrainer(run_dir, spec, device)
            fit(trainer, run_dir, writes_metrics=rank == 0, log=lambda m: logf.write(m + "\n"))
        seen = [0]
        hook = trainer.model.register_forward_pre_hook(
            lambda _m, args, kwargs: seen.__setitem__(0, seen[0] + len(next(iter(kwargs.values())) if kwargs
                                                                          else args[0])), with_kwargs=True)
        ev = trainer.evaluate()
        hook.remove()
        mine = {"eval_rows": seen[0], "eval": ev}
        if job.get("rss"):
            keep = trainer.dp_rank == 0 and trainer.tp_rank == 0
            mine["final_rss_mb"] = peak_rise_mb(lambda: dist_checkpoint.full_model_state(trainer.state_model,
                                                                                           keep=keep))
            dist.barrier()
            mine["old_rss_mb"] = peak_rise_mb(lambda: old_full_model_state(trainer.state_model))
            mine["model_mb"] = round(sum(v.numel() * v.element_size()  # (a DTensor's numel: the whole tensor's)
                                         for v in trainer.state_model.state_dict().values()) / 2**20, 1)
        allm = [None] * dist.get_world_size()
        dist.all_gather_object(allm, mine)
        if rank == 0:
            (run_dir / "gpu_ready.json").write_text(json.dumps(allm))
        del trainer
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
    from engine.runtime.train import _exit_now

    _exit_now(0)
