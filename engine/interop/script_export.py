"""Project -> a standalone, readable PyTorch training script (torch and numpy only).

The script holds the model as an nn.Module class whose attributes are the diagram's
node ids and whose forward runs in topological order with shape comments, the data
set, and the training loop. It trains exactly like Layerflow's runtime: modules are
built in the same order after the same torch.manual_seed (so the initial weights
equal build_graph_module(spec, seed)'s), batches come from the same seeded
permutations, and the optimizer, schedule and loss are the runtime's own functions,
copied into the script from engine/runtime by inspect.getsource so they cannot drift.
Synthetic data sets are generated inside the script with the code of engine/data/describe.py;
digits, npz and csv data sets travel as an .npz file beside the script.

Parallelism: the plan's pipeline (PipelineStage + GPipe/1F1B), tensor parallelism
(ColwiseParallel/RowwiseParallel per node from the plan's TP plan, attention heads
split across ranks) and data parallelism (DDP or FSDP2 fully_shard) are written out
with the calls engine/runtime/distributed/ makes, on the same pp x dp x tp device mesh;
the TP functions are copied from it by inspect.getsource, and so is engine/runtime/
sync_bn.py when the plan synchronizes BatchNorm over the data-parallel ranks.
"""
from __future__ import annotations

import inspect
import io
import pprint
import re
import textwrap
from pathlib import Path

from engine.data import describe as edata
from engine.diagram.compile import compile_graph
from engine.interop.common import InteropError
from engine.project import Project, atomic_write
from engine.data.sources import Digits, NpzFile, CsvFile
from engine.runtime import batches as rdata
from engine.runtime.datasets import base as dbase
from engine.runtime import layers as rl
from engine.runtime import ops as rops
from engine.runtime.ops import describe
from engine.runtime import steps as rsteps
from engine.runtime.distributed import pipeline as rpipeline, tensor_parallel as rtp
from engine.runtime import plan as rplan
from engine.runtime import sync_bn as rsync_bn
from engine.runtime import loop as rloop

# Layerflow's own layer classes, copied into the script when the diagram uses them.
OWN_CLASSES = {t: c.cls for t, c in rl.CTORS.items() if c.own}
# stateless layers written inline in forward (engine/runtime/layers.py FUNCTION_LAYERS)
_INLINE = {"Add": "{} + {}", "Mul": "{} * {}", "MatMul": "{} @ {}"}
_LOCAL_CLASH = {"self", "torch", "nn", "F", "np", "math"}
_GENERATORS = {"synthetic_classification": edata._classification, "synthetic_regression": edata._regression,
               "synthetic_sequence": edata._sequence, "synthetic_images": edata._images}


def _ctor(ntype: str, p: dict) -> str:
    """The constructor call the runtime makes for a node (engine/runtime/layers.py CTORS), as code."""
    if ntype in rl.CTORS:
        return rl.CTORS[ntype].code(p)
    if ntype == "Custom":
        return f"import_object({p['path']!r})(**{p.get('kwargs') or {}!r})"
    if ntype == "Op":  # the generic op: its ATen calls as data, run by AtenOp (copied into the script)
        return f"AtenOp({p['inputs']}, {p['code']!r}, {p['weights']!r})  # {describe(p)}"
    raise InteropError(f"layer type '{ntype}' has no script form; this exporter needs an update")



def _var(nid: str) -> str:
    return nid + "_" if nid in _LOCAL_CLASH else nid


def _stage_code(result, fwd: dict[str, str], stages: list[list[str]]) -> str:
    """class Stage: pipeline stage s runs the full model's layers of STAGES[s]; its
    inputs are the values live across the previous cut, its outputs those live across
    the next (a skip connection is carried through the stages it jumps over)."""
    from engine.runtime.model import build_graph_module
    from engine.runtime.distributed.stages import live_across

    spec = result.spec
    live = live_across(build_graph_module(spec, device="meta"), stages)
    outs = [next(n["args"][0] for n in spec["nodes"] if n["id"] == o) for o in spec["outputs"]]
    lines = ["class Stage(nn.Module):",
             '    """Pipeline stage `s` of STAGES: the full model\'s layers of that stage (the same objects,',
             '    so the same initial weights); values that cross a cut travel between the stages."""',
             "", "    def __init__(self, full: Model, s: int):", "        super().__init__()", "        self.s = s",
             "        for name in STAGES[s]:", "            if isinstance(getattr(full, name, None), nn.Module):",
             "                self.add_module(name, getattr(full, name))",
             "", "    def forward(self, *xs):", '        return getattr(self, f"forward_stage{self.s}")(*xs)']
    for s_i, ids in enumerate(stages):
        ins = spec["inputs"] if s_i == 0 else live[s_i - 1]
        ret = outs if s_i == len(stages) - 1 else live[s_i]
        lines += ["", f"    def forward_stage{s_i}(self, {', '.join(_var(v) for v in ins)}):"]
        lines += [f"        {fwd[nid]}" for nid in ids if nid in fwd]
        lines.append(f"        return {_var(ret[0]) if len(ret) == 1 else '(' + ', '.join(map(_var, ret)) + ')'}")
    return "\n".join(lines)


def _model_code(result) -> tuple[str, list[str]]:
    spec = result.spec
    nodes = spec["nodes"]
    used = {n["type"] for n in nodes}
    pre = [inspect.getsource(OWN_CLASSES[t]) for t in OWN_CLASSES if t in used]
    if "Custom" in used:
        pre.append(inspect.getsource(rl.import_object))
    if "Op" in used:  # engine/runtime/ops.py as it is (torch and the standard library only)
        src = inspect.getsource(rops).replace("from __future__ import annotations\n", "")
        pre.append(src[src.index('"""', 3) + 3:].strip())
    init, fwd = [], []
    for n in nodes:
        nid, t, p = n["id"], n["type"], n["params"]
        if t in ("Input", "Output") or t in rl.FUNCTION_LAYERS:
            continue
        init.append(f"self.{nid} = {_ctor(t, p)}")
    inputs = spec["inputs"]
    for n in nodes:
        nid, t, p, args = n["id"], n["type"], n["params"], [_var(a) for a in n.get("args", [])]
        if t in ("Input", "Output"):
            continue
        if t in _INLINE:
            code = f"{_var(nid)} = {_INLINE[t].format(*args)}"
        elif t == "Concat":
            code = f"{_var(nid)} = torch.cat(({', '.join(args)},), dim={p['dim']})"
        else:
            code = f"{_var(nid)} = self.{nid}({', '.join(args)})"
        fwd.append((code, result.nodes[nid].out.label()))
    outs = [_var(next(n["args"][0] for n in nodes if n["id"] == o)) for o in spec["outputs"]]
    width = max([len(c) for c, _ in fwd] + [20]) + 2
    sig = ", ".join(_var(i) for i in inputs)
    in_shapes = ", ".join(f"{_var(i)}: {result.nodes[i].out.label()} {result.nodes[i].out.dtype}" for i in inputs)
    lines = ["class Model(nn.Module):",
             f'    """{len(nodes)} nodes, {result.total_params:,} parameters. Layers are created in '
             'topological order,\n    as Layerflow builds them, so torch.manual_seed(SEED) gives the same initial weights."""',
             "", "    def __init__(self):", "        super().__init__()"]
    # shared parameters (a layer called twice, tied embeddings): one tensor
    init += [f"self.{dst} = self.{src}" for dst, src in (spec.get("ties") or {}).items()]
    lines += [f"        {s}" for s in init] or ["        pass"]
    lines += ["", f"    def forward(self, {sig}):  # {in_shapes}"]
    lines += [f"        {c.ljust(width)}# {s}" for c, s in fwd]
    lines.append(f"        return {outs[0] if len(outs) == 1 else '(' + ', '.join(outs) + ',)'}")
    fwd_by_id = {n["id"]: f"{c.ljust(width)}# {sh}" for n, (c, sh) in
                 zip([n for n in nodes if n["type"] not in ("Input", "Output")], fwd)}
    return "\n".join(lines), pre, fwd_by_id


def _data_code(project: Project, data_file: str | None) -> str:
    d = project.training.dataset
    if data_file:
        return textwrap.dedent(f'''\
            def load_data():
                """The data set as Layerflow prepared it ({d.kind}), saved beside this script."""
                with np.load(Path(__file__).with_name({data_file!r}), allow_pickle=False) as z:
                    return z["x_train"], z["y_train"], z["x_val"], z["y_val"]
            ''')
    gen = _GENERATORS[d.kind]
    fields = d.model_dump(mode="json")
    def source(f) -> str:  # the settings' type (a pydantic model of engine/project.py) is no name in the script
        return re.sub(r"\(d: \w+", "(d", inspect.getsource(f))

    parts = [
        "class ProjectError(ValueError):\n    pass\n",
        inspect.getsource(edata.Arrays),
        *([inspect.getsource(dbase.seeded_split)] if "seeded_split" in inspect.getsource(edata._split) else []),
        inspect.getsource(edata._split),
        *([source(edata._next_token)] if gen is edata._sequence else []),
        source(gen),
        textwrap.dedent(f'''\
            def load_data():
                """{d.kind}, generated exactly as Layerflow's engine/data/describe.py does."""
                a = {gen.__name__}(SimpleNamespace(**{fields!r}))
                return a.x_train, a.y_train, a.x_val, a.y_val
            '''),
    ]
    return "\n\n".join(parts)


def _launch_line(pl: dict) -> str:
    dpk = pl["data_parallel"].upper()
    dp = f" x {dpk} dp={pl['dp']}" if pl["dp"] > 1 else ""
    tp = f" x tensor parallel tp={pl['tp']}" if pl["tp"] > 1 else ""
    if pl["pp"] > 1:
        sched = {"gpipe": "GPipe", "1f1b": "1F1B"}.get(pl["schedule"], pl["schedule"])
        return f"Pipeline pp={pl['pp']} ({sched}, {pl['microbatches']} micro-batches){dp}{tp}"
    if pl["tp"] > 1:
        return f"Tensor parallel tp={pl['tp']}{dp}"
    return f"Data parallel ({dpk}) over {max(pl['dp'], 2)} processes"


def _plan_of(project: Project, plan) -> dict:
    """The parallelism to write out: engine/planning/planner.py's Plan (or its runtime dict),
    else the project's placement."""
    pl = project.placement
    base = {"pp": pl.pp, "dp": pl.dp, "tp": pl.tp, "data_parallel": pl.data_parallel,
            "reshard_after_forward": pl.reshard_after_forward, "mixed_precision": pl.mixed_precision,
            "sync_batchnorm": pl.sync_batchnorm, "schedule": pl.schedule, "microbatches": pl.microbatches,
            "tp_plan": {}, "stages": None}
    if hasattr(plan, "runtime_plan"):
        plan = plan.runtime_plan()
    if plan:
        base.update({k: plan[k] for k in base if k in plan})
    if not base["microbatches"]:  # left to the planner: as it chooses
        from engine.planning.autoplace import auto_microbatches

        pp = int(base["pp"])
        base["microbatches"] = auto_microbatches(project.training.batch_size, max(1, int(base["dp"])), pp, pp) \
            if pp > 1 else 1
    return base


DIST_CODE = '''\
def init_distributed(pp: int, dp: int, tp: int):
    """torchrun sets RANK/WORLD_SIZE; the calls are engine/runtime/distributed/'s.
    Ranks are laid out pp-major, tp-minor: rank = (pp_i * dp + dp_i) * tp + tp_i,
    so tensor-parallel peers, which talk most, are neighbours."""
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        device, backend = torch.device("cuda", local), "cpu:gloo,cuda:nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend=backend)
    if dist.get_world_size() != pp * dp * tp:
        raise SystemExit(f"this script is planned for pp={pp} x dp={dp} x tp={tp} processes but "
                         f"{dist.get_world_size()} were started: run torchrun --nproc_per_node={pp * dp * tp}")
    mesh = init_device_mesh(device.type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
    return device, mesh


def apply_dp(module: nn.Module, dp_mesh, kind: str, reshard_after_forward: bool, mixed_precision: str) -> nn.Module:
    #@fsdp
    if kind == "fsdp":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \\
            if mixed_precision == "bf16" else MixedPrecisionPolicy()
        norms = set()
        if mixed_precision == "bf16":  # BatchNorm keeps float32 (its statistics are), handing bf16 on
            keep = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32,
                                        output_dtype=torch.bfloat16)
            for sub in module.modules():
                if sub is not module and isinstance(sub, nn.modules.batchnorm._BatchNorm):
                    fully_shard(sub, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, mp_policy=keep)
                    norms.add(id(sub))
        # one FSDP unit per layer: only one layer's parameters are whole at a time
        for child in module.children():
            if id(child) not in norms and any(True for _ in child.parameters()):
                fully_shard(child, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp)
        fully_shard(module, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp)
        return module
    #@end
    #@tp
    if any(hasattr(p, "device_mesh") for p in module.parameters()):
        raise SystemExit("DDP does not combine with tensor parallel (it swaps the DTensor parameters for "
                         "local ones); plan data_parallel fsdp instead")
    #@end
    return DDP(module, process_group=dp_mesh.get_group(), gradient_as_bucket_view=True)
'''


MAIN_CODE = '''\
def load_model() -> nn.Module:
    """The model with the weights this script was exported with (WEIGHTS, else the initial
    weights of SEED), in eval mode on the CPU: `from NAME import load_model` for inference."""
    torch.manual_seed(SEED)
    model = Model()
    if WEIGHTS:
        state = torch.load(Path(__file__).with_name(WEIGHTS), map_location="cpu", weights_only=True)
        model.load_state_dict(state, strict=False)
    return model.eval()


def evaluate(model, x_val, y_val, device) -> dict:
    model.eval()
    total, n, correct = 0.0, 0, 0
    with torch.no_grad():
        for x, y in array_eval_batches(x_val, y_val, batch_size=max(BATCH_SIZE, 256)):
            x, y = x.to(device), y.to(device)
            out = model(x)
            total += compute_loss(LOSS, out, y).item() * len(x)
            n += len(x)
            if LOSS == "cross_entropy":
                correct += correct_count(out, y)
    model.train()
    rec = {"val_loss": total / max(n, 1)}
    if LOSS == "cross_entropy":
        rec["val_acc"] = correct / max(n, 1)
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=STEPS, help=f"optimizer steps (default {STEPS})")
    ap.add_argument("--out", default=".", help="folder for metrics.jsonl and model.pt")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    pp = PLAN["pp"] if distributed else 1
    tp = PLAN["tp"] if distributed else 1
    if distributed:
        device, mesh = init_distributed(pp, PLAN["dp"], tp)
        rank, dp_rank, dp = dist.get_rank(), mesh["dp"].get_local_rank(), PLAN["dp"]
        pp_rank, tp_rank = mesh["pp"].get_local_rank(), mesh["tp"].get_local_rank()
    else:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        rank, dp_rank, dp, pp_rank, tp_rank = 0, 0, 1, 0, 0
    #@pp
    first = pp_rank == 0  # the first stage reads the batch, the last one computes the loss
    #@end
    last = pp_rank == pp - 1

    seed_all(SEED)
    torch.manual_seed(SEED)  # the same initial weights as Layerflow's runtime for this seed
    model = Model()
    if WEIGHTS:
        state = torch.load(Path(__file__).with_name(WEIGHTS), map_location="cpu", weights_only=True)
        model.load_state_dict(state, strict=False)
    #@pp
    if pp > 1:  # this rank's pipeline stage: the full model's layers of that stage
        model = Stage(model, pp_rank)
    #@end
    model.to(device).train()
    #@syncbn
    if distributed and PLAN["sync_batchnorm"] and dp > 1:
        # batch statistics over the whole data-parallel batch (torch's SyncBatchNorm on GPUs, an all-reduce on CPU)
        model = convert_sync_batchnorm(model, mesh["dp"].get_group(), device)
    #@end
    #@tp
    if tp > 1:  # first TP (parameters become DTensors over the tp mesh), then DP wraps what TP made
        apply_tp(model, mesh["tp"], {n: TPEntry.from_json(e, f"PLAN tp_plan.{n}") for n, e in PLAN["tp_plan"].items()})
    #@end
    if distributed and dp > 1:
        model = apply_dp(model, mesh["dp"], PLAN["data_parallel"], PLAN["reshard_after_forward"],
                         PLAN["mixed_precision"])
    # placement.mixed_precision bf16: the forward and the loss autocast (FSDP casts through its policy instead)
    amp = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if PLAN["mixed_precision"] == "bf16" and not (
        dp > 1 and PLAN["data_parallel"] == "fsdp") else contextlib.nullcontext
    schedule = None
    #@pp
    if pp > 1:
        stage = PipelineStage(model, pp_rank, pp, device, group=mesh["pp"].get_group())
        cls = ScheduleGPipe if PLAN["schedule"] == "gpipe" else Schedule1F1B
        schedule = cls(stage, PLAN["microbatches"], loss_fn=lambda out, y: compute_loss(LOSS, out, y))
    #@end
    opt = make_optimizer(model.parameters(), OPTIMIZER)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(SCHEDULE, args.steps))
    x_train, y_train, x_val, y_val = load_data()
    batches = Batches(x_train, y_train, BATCH_SIZE, SEED)
    m = PLAN["microbatches"] if pp > 1 else 1
    if BATCH_SIZE % (dp * m):
        raise SystemExit(f"batch size {BATCH_SIZE} is not divisible by dp={dp} x microbatches={m}")
    local = BATCH_SIZE // dp

    metrics = open(out / "metrics.jsonl", "w") if rank == 0 else None
    t0 = time.perf_counter()
    loss_sum, last_log = torch.zeros((), dtype=torch.float64, device=device), 0
    for step in range(args.steps):
        x, y = batches.batch(step)  # the global batch; each replica takes its slice (tp peers the same one)
        x, y = x[dp_rank * local:(dp_rank + 1) * local].to(device), y[dp_rank * local:(dp_rank + 1) * local].to(device)
        opt.zero_grad(set_to_none=True)
        if schedule is None:  # GRAD_ACCUMULATION equal micro-batches: the mean of their mean losses
            for xm, ym in zip(x.chunk(GRAD_ACCUMULATION), y.chunk(GRAD_ACCUMULATION)):
                with amp():
                    loss = compute_loss(LOSS, model(xm), ym) / GRAD_ACCUMULATION
                loss.backward()
                loss_sum += loss.detach()  # on the device: read only at log steps (no sync per step)
        #@pp
        else:  # micro-batches flow through the stages; the last one computes their losses
            losses = []
            with amp():
                if step == 0:
                    infer_stage_shapes(schedule, [model], (x,) if first else (), y if last else None)
                schedule.step(*((x,) if first else ()), target=y if last else None, losses=losses, return_outputs=False)
            if last:
                loss_sum += torch.stack([v.detach() for v in losses]).mean()
        #@end
        if GRAD_CLIP:  # by the norm over the whole model, as one process would
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            # a sharded gradient (FSDP, TP) is a DTensor: full_tensor() adds its shards' squares
            norms = [torch.linalg.vector_norm(g) for g in grads]
            norm = torch.linalg.vector_norm(torch.stack([n.full_tensor() if hasattr(n, "full_tensor") else n
                                                         for n in norms]))
            #@pp
            if pp > 1:  # stages add their squares
                sq = norm.pow(2)
                dist.all_reduce(sq, group=mesh["pp"].get_group())
                norm = sq.sqrt()
            #@end
            coef = (GRAD_CLIP / (norm + 1e-6)).clamp(max=1.0)  # torch's clip_grad_norm_ formula, kept on the device
            torch._foreach_mul_([g.to_local() if hasattr(g, "to_local") else g for g in grads], coef)
        opt.step()
        sched.step()
        evaluating = schedule is None and ((step + 1) % EVAL_INTERVAL == 0 or step + 1 == args.steps)
        if (step + 1) % LOG_INTERVAL and step + 1 != args.steps and not evaluating:
            continue
        value = loss_sum
        if distributed:  # the last stage's losses, averaged over replicas: the global batch's loss
            # (tp peers computed the same loss: count one of them)
            value = loss_sum * (1.0 if last and tp_rank == 0 else 0.0)
            dist.all_reduce(value)
            value = value / dp
        n = step + 1 - last_log
        rec = {"step": step + 1, "epoch": batches.epoch_of(step), "time": round(time.perf_counter() - t0, 4),
               "loss": float(value) / n, "lr": opt.param_groups[0]["lr"]}
        if n > 1:
            rec["steps"] = n  # the loss is the mean over this many steps
        loss_sum, last_log = torch.zeros((), dtype=torch.float64, device=device), step + 1
        if evaluating:
            rec.update(evaluate(model, x_val, y_val, device))
        if metrics:
            metrics.write(json.dumps(rec) + "\\n")
            metrics.flush()
            print(" ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in rec.items()))
    if metrics:
        metrics.close()
    #@pp
    if pp > 1:  # each stage saves its own layers (their keys are the full model's)
        state = model.module.state_dict() if isinstance(model, DDP) else model.state_dict()
        if dp_rank == 0 and PLAN["data_parallel"] != "fsdp":
            torch.save(state, out / f"model.stage{pp_rank}.pt")
        dist.barrier()  # no rank tears its process group down while another still talks to it
        dist.destroy_process_group()
        return
    #@end
    if distributed:
        if dp == 1 and tp == 1:
            state = model.state_dict()
        #@sharded
        elif tp > 1 or PLAN["data_parallel"] == "fsdp":  # gather the DTensor shards into whole tensors
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
            state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        #@end
        else:
            state = model.module.state_dict()
        if rank == 0:
            torch.save(state, out / "model.pt")
        dist.barrier()  # no rank tears its process group down while another still talks to it
        dist.destroy_process_group()
    else:
        torch.save(model.state_dict(), out / "model.pt")


if __name__ == "__main__":
    main()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # everything is written and the process group is gone: end without the interpreter's
        # teardown, whose C++ destructors can race gloo's threads ("terminate called without
        # an active exception", now and then under load)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
'''


def _features(pl: dict) -> set[str]:
    """What of the parallel code this plan runs: the script holds that and nothing else."""
    used = set()
    if pl["pp"] > 1:
        used.add("pp")
    if pl["tp"] > 1:
        used.add("tp")
    if pl["data_parallel"] == "fsdp":
        used.add("fsdp")
    if used & {"tp", "fsdp"}:
        used.add("sharded")
    if pl["sync_batchnorm"]:
        used.add("syncbn")
    return used


def _only(code: str, used: set[str]) -> str:
    """`code` without the blocks between `#@feature` and `#@end` lines whose feature the
    plan does not use (blocks nest; the marker lines go too)."""
    out, tags = [], []
    for line in code.splitlines(keepends=True):
        mark = line.strip()
        if mark.startswith("#@"):
            tags.pop() if mark == "#@end" else tags.append(mark[2:])
            continue
        if all(t in used for t in tags):
            out.append(line)
    return "".join(out)


def _parallel_code(used: set[str]) -> list[str]:
    funcs = [*((rtp.placement, rtp.tp_module_plan, rtp.apply_tp) if "tp" in used else ()),
             *((rsteps.left_as_it_was, rpipeline.infer_stage_shapes) if "pp" in used else ())]
    if not funcs:
        return []
    out = []
    if "tp" in used:  # the plan's tensor-parallel entries, typed as the runtime reads them
        out += ["# ----- the plan's layouts: engine/runtime/plan.py's types " + "-" * 20,
                "\n\n".join([inspect.getsource(rplan.PlanError), inspect.getsource(rplan.Layout),
                             'REPLICATE = Layout("replicate")\nPARTIAL = Layout("partial")\n'
                             f"TP_STYLES = {rplan.TP_STYLES!r}", inspect.getsource(rplan.TPEntry)])]
    return out + ["# ----- tensor parallelism and pipelining: engine/runtime/distributed/'s functions ---",
                  "\n\n".join(inspect.getsource(f) for f in funcs)]


def prune_imports(code: str) -> str:
    """Drop the top-level imports (or the names of a `from` import) that the script never
    uses, so that what it imports is what it needs (pyflakes' F401, by the AST)."""
    import ast

    tree = ast.parse(code)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    used |= {n.value.id for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
    lines = code.splitlines(keepends=True)
    for node in reversed(tree.body):
        if not isinstance(node, (ast.Import, ast.ImportFrom)) or node.end_lineno != node.lineno:
            continue
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        keep = [a for a in node.names if (a.asname or a.name).split(".")[0] in used]
        if len(keep) == len(node.names):
            continue
        names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in keep)
        if not keep:
            text = ""
        elif isinstance(node, ast.ImportFrom):
            text = f"from {'.' * node.level}{node.module} import {names}\n"
        else:
            text = f"import {names}\n"
        lines[node.lineno - 1] = text
    return "".join(lines)


def _sync_bn_code(pl: dict) -> list[str]:
    """engine/runtime/sync_bn.py's functions, when the plan synchronizes BatchNorm."""
    if not pl["sync_batchnorm"]:
        return []
    head = ("import torch.distributed._functional_collectives as funcol\n"
            "from torch.nn.modules.batchnorm import _BatchNorm\n\n"
            'TORCH_SYNC_BN_DEVICES = ("cuda", "xpu", "hpu", torch._C._get_privateuse1_backend_name())')
    return ["# ----- BatchNorm over the data-parallel batch: engine/runtime/sync_bn.py's code " + "-" * 2,
            "\n\n".join([head, *(inspect.getsource(f) for f in (rsync_bn.SyncBatchNormCPU, rsync_bn._to_cpu_sync,
                                                                  rsync_bn.convert_sync_batchnorm))])]


def script_text(project: Project, plan: dict | None = None, data_file: str | None = None,
                weights_file: str | None = None) -> str:
    result = compile_graph(project.graph)
    if not result.ok:
        raise InteropError("the diagram has errors; fix them before exporting:\n"
                           + "\n".join(f"  {e}" for e in result.errors))
    if len(result.spec["inputs"]) != 1 or len(result.spec["outputs"]) != 1:
        raise InteropError("the training script needs exactly one Input and one Output node")
    loss = result.loss()
    if loss == "none":
        raise InteropError(f"node '{result.output_node()}' (Output): loss is none; choose cross_entropy or mse to train")
    tr = project.training
    arrays = edata.load_arrays(project)
    from engine.runs.build import check_data, total_steps

    errs = check_data(result, arrays)
    if errs:
        raise InteropError("the data set does not fit the diagram (set training.dataset):\n"
                           + "\n".join(f"  {e}" for e in errs))

    steps = total_steps(project, len(arrays.x_train))
    pl = _plan_of(project, plan)
    used = _features(pl)
    model_code, pre, fwd_by_id = _model_code(result)
    if pl["pp"] > 1:
        if not pl.get("stages"):
            from engine.runtime.model import build_graph_module
            from engine.runtime.distributed.stages import even_stages

            pl["stages"] = even_stages(build_graph_module(result.spec, device="meta"), pl["pp"])
        model_code += "\n\n\n" + _stage_code(result, fwd_by_id, pl["stages"])
    name = Path(project.path).stem if project.path else project.name
    script = f"{name}.py"
    notes = ""
    if pl["tp"] > 1:
        styles = ", ".join(f"{nid} {e['style']}" for nid, e in pl["tp_plan"].items())
        notes = f"Tensor parallel styles (PLAN['tp_plan']): {styles or 'none'}.\n"
    world = pl["pp"] * max(pl["dp"], 1) * pl["tp"]
    doc = textwrap.dedent(f'''\
        """{project.name}: a standalone PyTorch training script written by Layerflow.

        Model: {len(result.spec["nodes"])} nodes, {result.total_params:,} parameters, {result.total_flops:,} FLOPs per sample.
        Data: {tr.dataset.kind}. Training: {tr.optimizer.name} (lr {tr.optimizer.lr:g}), {tr.schedule.name} schedule,
        {steps} steps of batch {tr.batch_size}, seed {tr.seed}, loss {loss}.
        The losses equal those of Layerflow's runtime for the same seed.

        Run on one device:
            python {script} [--steps N] [--out DIR]
        {_launch_line(pl)} (gloo on CPU, nccl on GPUs):
            torchrun --standalone --nproc_per_node={max(world, 2)} {script}
        NOTES"""''').replace("NOTES", notes)  # after dedent: notes start at column 0
    stages = pl.pop("stages", None)
    if pl["pp"] > 1 and pl["schedule"] not in ("gpipe", "1f1b"):
        raise InteropError(f"placement.schedule '{pl['schedule']}' runs several stages per rank; the exported "
                           "script builds one stage per rank (gpipe or 1f1b): set placement.schedule to one of them "
                           "to export (Layerflow's runtime runs every schedule)")
    if pl["dp"] < 2 and pl["pp"] == 1 and pl["tp"] == 1:  # a single-device plan: still runnable under torchrun as dp=WORLD_SIZE
        plan_line = f'PLAN = {dict(pl, dp=0)!r}\nPLAN["dp"] = int(os.environ.get("WORLD_SIZE", "1"))'
    else:
        plan_line = "PLAN = " + pprint.pformat(pl, width=110, sort_dicts=False)
    settings = "\n".join([
        f"SEED = {tr.seed}",
        f"BATCH_SIZE = {tr.batch_size}",
        f"STEPS = {steps}",
        f"EVAL_INTERVAL = {tr.eval_interval}",
        f"LOG_INTERVAL = {tr.log_interval or 10}  # steps per metrics line: the mean loss of those steps",
        f"GRAD_CLIP = {tr.grad_clip!r}",
        f"GRAD_ACCUMULATION = {tr.grad_accumulation}  # micro-batches per optimizer step (one process)",
        f"LOSS = {loss!r}",
        f"OPTIMIZER = {tr.optimizer.model_dump(mode='json')!r}",
        f"SCHEDULE = {tr.schedule.model_dump(mode='json')!r}",
        f"WEIGHTS = {weights_file!r}  # weights beside this script (a run's, or an imported model's), or None",
        plan_line,
        f"STAGES = {stages!r}  # pipeline stages: node ids per stage",
    ])
    imports = textwrap.dedent('''\
        from __future__ import annotations

        import argparse
        import contextlib
        import importlib
        import json
        import math
        import os
        import random
        import sys
        import time
        from dataclasses import dataclass
        from pathlib import Path
        from types import SimpleNamespace
        from typing import Callable

        import numpy as np
        import torch
        import torch.distributed as dist
        import torch.nn.functional as F
        from torch import nn
        from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
        from torch.distributed.tensor import Replicate, Shard
        from torch.nn.parallel import DistributedDataParallel as DDP
        ''')
    runtime = "\n\n".join(inspect.getsource(f) for f in (
        rloop.seed_all, rloop.lr_lambda, rloop.make_optimizer, rloop.compute_loss, rloop.correct_count,
        rdata.Batches, rdata.array_eval_batches))
    sections = [
        doc, imports, settings,
        "# ----- the model " + "-" * 60, *pre, model_code,
        "# ----- the data " + "-" * 61, _data_code(project, data_file),
        "# ----- training: the functions of Layerflow's engine/runtime (loop.py, data.py) " + "-" * 3, runtime,
        "# ----- the mesh and data parallelism " + "-" * 40, _only(DIST_CODE, used),
        *_parallel_code(used),
        *_sync_bn_code(pl),
        "# ----- the loop " + "-" * 61, _only(MAIN_CODE, used),
    ]
    return prune_imports("\n\n".join(s.rstrip() + "\n" for s in sections))


def export_script(project: Project, path: str | Path, plan: dict | None = None, *, run=None,
                  checkpoint: str | None = None) -> Path:
    """Write NAME.py (and NAME.data.npz / NAME.weights.pt beside it when the data set
    or the weights cannot be generated inside the script). With `run` (a run folder) the
    script starts from that run's weights at `checkpoint` (final, latest, best, step_N),
    written as NAME.weights.pt; a run of another diagram is refused."""
    path = Path(path)
    d = project.training.dataset
    stem = path.name[:-3] if path.name.endswith(".py") else path.name
    data_file = f"{stem}.data.npz" if isinstance(d, (Digits, NpzFile, CsvFile)) else None
    run_bytes = None
    if run is not None:
        from engine.runs.weights import run_state, state_bytes

        run_bytes = state_bytes(run_state(project, run, checkpoint))
    weights_file = f"{stem}.weights.pt" if project.weights or run_bytes is not None else None
    text = script_text(project, plan, data_file, weights_file)
    compile(text, str(path), "exec")  # a generated syntax error is our bug: never write it
    weights_bytes = run_bytes
    if weights_bytes is None and weights_file:  # read (tensors only) before anything is written
        from engine.runs.weights import project_weights_bytes

        src = project.resolve_path(project.weights)
        if not src.exists():
            raise InteropError(f"weights: {src} does not exist")
        weights_bytes = project_weights_bytes(project, src)
    if data_file:
        buf = io.BytesIO()
        a = edata.load_arrays(project)
        import numpy as np

        np.savez(buf, x_train=a.x_train, y_train=a.y_train, x_val=a.x_val, y_val=a.y_val)
        atomic_write(path.with_name(data_file), buf.getvalue())
    if weights_bytes is not None:
        atomic_write(path.with_name(weights_file), weights_bytes)
    atomic_write(path, text.encode("utf-8"))
    return path
