"""Memory chosen by the planner (issue 47): auto-placement of a GPT that fits no layout of
2 devices without activation checkpointing, its chosen plan, and that plan's memory
predicted against measured.

    python bench/memory_choice.py [--blocks 12] [--steps 8] [--fraction 0.85]

1. The GPT (nanoGPT's architecture, tests/models/real_models.py) is planned on every layout
   of 2 devices with memory savings off and unlimited memory; the device is then given
   `fraction` of the smallest peak any layout needs, so none fits as it is.
2. `auto_place` on that device: the layout it chose, the layers it checkpoints (and CPU
   offload, if any), their cost per step, and each rank's predicted memory.
3. Measured, two ways:
   - activations: one rank's forward (its local batch) with the chosen checkpointing and
     without it, the bytes autograd saves for backward counted by
     torch.autograd.graph.saved_tensors_hooks (parameters excluded; storages counted once),
     against the planner's activation estimate for the same two cases;
   - the state (parameters, gradients, optimizer) and a real run: the chosen plan trained
     for a few steps under torchrun (2 processes, gloo), and the same layout without the
     savings; each rank's peak RSS (an upper bound: it holds the interpreter and torch too).
Prints a table. Not a test: numbers depend on this machine.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "models"))  # the GPT of the tests (nanoGPT's architecture)

import torch  # noqa: E402
from real_models import GPT  # noqa: E402

from engine.planning.autoplace import auto_place  # noqa: E402
from engine.diagram.compile import compile_graph  # noqa: E402
from engine.planning.cost import local_cpu  # noqa: E402
from engine.interop import save_imported  # noqa: E402
from engine.interop.module.importer import from_module  # noqa: E402
from engine.planning.planner import make_plan  # noqa: E402
from engine.project import load_project  # noqa: E402
from engine.runs.build import prepare_run  # noqa: E402

MIB = 2 ** 20
SEQ, BATCH = 64, 16


def gpt_project(tmp: Path, blocks: int, steps: int):
    torch.manual_seed(0)
    imp = from_module(GPT(vocab_size=2048, block_size=SEQ, n_layer=blocks, n_head=4, n_embd=128).eval(), [[SEQ]],
                      ["int64"])
    path = save_imported(imp, tmp / f"gpt{blocks}.lflow")
    p = load_project(path)
    p.training.batch_size = BATCH
    p.training.steps = steps
    p.training.log_interval = 1
    p.training.eval_interval = 10 ** 6
    p.training.checkpoint_interval = 10 ** 6
    p.training.optimizer.name = "adamw"
    return p


def saved_bytes(run_dir: Path, checkpoint: set[str], local_batch: int) -> int:
    """Bytes autograd keeps for backward in one forward of the run's model on `local_batch`
    samples, with activation checkpointing on `checkpoint` (the runtime's own builder)."""
    from engine.runtime.model import build_graph_module, load_weights
    from engine.runtime.spec import RunSpec
    from engine.runtime.distributed.stages import apply_checkpointing

    spec = RunSpec.load(run_dir)
    gm = build_graph_module(spec.model, device="cpu", seed=spec.training.seed)
    if spec.weights:
        load_weights(gm, str(run_dir / spec.weights))
    gm = apply_checkpointing(gm, checkpoint)
    gm.train()
    params = {p.untyped_storage().data_ptr() for p in gm.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    x = torch.randint(0, 2048, (local_batch, SEQ))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = gm(x)
        out.float().sum()
    return sum(seen.values())


def train(run_dir: Path, nproc: int) -> list[float]:
    from remote.launch.local import launch_local

    job = launch_local(run_dir, nproc)
    rc = job.wait()
    status = json.loads((run_dir / "status.json").read_text())
    if rc or status["state"] != "succeeded":
        raise SystemExit(f"{run_dir.name}: {status['state']}: {status.get('error')}")
    return json.loads((run_dir / "peak_mem_per_rank.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--fraction", type=float, default=0.85,
                    help="the device's memory, as a fraction of the smallest peak any layout needs without savings")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        p = gpt_project(tmp, args.blocks, args.steps)
        compiled = compile_graph(p.graph)
        big = replace(local_cpu(2), memory_bytes=2 ** 50)
        off = p.copy()
        off.placement.memory_savings = "off"
        every = auto_place(off, 2, big, compiled).candidates
        need = min(c["peak_bytes"] for c in every if c["feasible"])
        device = replace(big, memory_bytes=int(need * args.fraction))
        try:
            auto_place(off, 2, device, compiled)
            raise SystemExit("a layout fits without savings: lower --fraction")
        except ValueError:
            pass
        t = time.perf_counter()
        a = auto_place(p, 2, device, compiled)
        choose_s = time.perf_counter() - t
        plan, ms = a.plan, a.plan.memory_savings
        pl = p.placement.derive(**a.placement)
        print(f"GPT {args.blocks} blocks (width 128, {SEQ} tokens, batch {BATCH}, AdamW): the smallest layout of 2 "
              f"devices needs {need / MIB:.1f} MiB a device; the device has {device.memory_bytes / MIB:.1f} MiB")
        print(f"chosen in {choose_s:.2f} s: pp={pl.pp} x dp={pl.dp} x tp={pl.tp} ({pl.data_parallel})")
        for r in a.reasons:
            print(f"  {r}")
        if ms is None or not ms.chosen:
            raise SystemExit("the planner chose no memory savings")
        bare = make_plan(off, 2, big, compiled, placement=pl.derive(memory_savings="off"), stages=a.stages,
                         styles=a.styles)
        runs = {}
        for name, pr in (("chosen", plan), ("no savings", bare)):
            rd = prepare_run(p, tmp / name.replace(" ", "_"), steps=args.steps, placement=pl,
                             plan=pr.runtime_plan())
            runs[name] = (pr, rd)
        rows = []
        local = BATCH // pl.dp
        for name, (pr, rd) in runs.items():
            pred_act = max(d.memory.activations_bytes for d in pr.devices)
            meas_act = saved_bytes(rd, set(pr.run.checkpoint), local) if pl.pp == 1 else None
            rss = train(rd, 2)
            rows.append((name, pr, pred_act, meas_act, rss))
        print("\n| plan | checkpointed layers | state per rank, predicted (MiB) | activations predicted (MiB) "
              "| saved for backward, measured (MiB) | device total predicted (MiB) | peak RSS per rank (MiB) |")
        print("|---|---|---|---|---|---|---|")
        for name, pr, pa, ma, rss in rows:
            state = max(d.memory.state_bytes for d in pr.devices)
            total = max(d.memory.total_bytes for d in pr.devices)
            print(f"| {name} | {len(pr.run.checkpoint)} | {state / MIB:.1f} | {pa / MIB:.1f} | "
                  f"{'n/a' if ma is None else f'{ma / MIB:.1f}'} | {total / MIB:.1f} "
                  f"{'(fits)' if total <= device.memory_bytes else '(does not fit)'} | "
                  f"{' / '.join(f'{x:.0f}' for x in rss)} |")
        (_, pc, pac, mac, rc), (_, pb, pab, mab, rb) = rows
        if mac is not None and mab:
            print(f"\ncheckpointing saves {(pab - pac) / MIB:.1f} MiB of activations a rank predicted, "
                  f"{(mab - mac) / MIB:.1f} MiB measured (saved tensors); peak RSS "
                  f"{max(rb) - max(rc):+.0f} MiB (without - with); "
                  f"the recompute costs +{ms.recompute_s * 1e3:.2f} ms/step predicted")


if __name__ == "__main__":
    main()
