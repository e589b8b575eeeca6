"""plan: where each layer runs, what each device holds, what moves between them;
place: put nodes or whole blocks on a pipeline stage or give them a tensor-parallel style."""
from __future__ import annotations

import argparse
import json
import sys

from engine.project import load_project


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="distributed plan: mesh, stages, TP layouts, communication, memory per device")
    p.add_argument("project")
    p.add_argument("--nproc", type=int, help="processes/devices (default: the placement's dp*tp*pp)")
    p.add_argument("--auto", action="store_true", help="choose pp/dp/tp, stage cuts and TP styles for --nproc devices")
    p.add_argument("--device", default="cpu", help="device kind for memory/time: cpu, a100-80gb, h100-80gb, h200, rtx4090")
    p.add_argument("--memory-gb", type=float, help="memory per device in GiB (overrides the device kind's)")
    p.add_argument("--accept", action="store_true", help="with --auto: write the chosen placement into the project file")
    p.add_argument("--json", action="store_true", help="machine-readable output (the plan document)")
    from app.cli_placement import add_placement_flags

    add_placement_flags(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("place", help="put nodes or blocks (what they hold) on a pipeline stage or give them a TP style")
    p.add_argument("project")
    p.add_argument("targets", nargs="+", metavar="NODE_OR_BLOCK", help="node ids or block paths (layer3, layer3/layer3.1)")
    p.add_argument("--stage", help="pipeline stage (0, 1, ...), or 'auto' to clear it")
    p.add_argument("--tp", help="tensor-parallel style: colwise, rowwise, sequence, replicate, "
                                "pairs (Megatron's colwise/rowwise pairs inside a block) or auto (clear)")
    p.add_argument("-o", "--output", help="write here instead of over PROJECT")
    p.set_defaults(func=cmd_place)


def _device(args, nproc: int):
    from dataclasses import replace

    from app.cli import CliError
    from engine.cost import device_from_name

    try:
        dev = device_from_name(args.device, nproc)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.memory_gb is not None:
        if args.memory_gb <= 0:
            raise CliError(f"--memory-gb must be positive, not {args.memory_gb}")
        dev = replace(dev, memory_bytes=int(args.memory_gb * 2**30))
    return dev


def cmd_plan(args) -> int:
    from app.cli import CliError
    from engine.autoplace import apply_to_project, auto_place
    from engine.compile import compile_graph
    from engine.planner import format_plan, make_plan
    from engine.project import save_project

    if args.nproc is not None and args.nproc < 1:
        raise CliError(f"--nproc must be at least 1, not {args.nproc}")
    from app.cli_placement import with_placement_flags

    project = with_placement_flags(load_project(args.project), args)
    compiled = compile_graph(project.graph)
    if not compiled.ok:
        raise CliError("the diagram has errors:\n" + "\n".join(f"  {e}" for e in compiled.errors))
    pl = project.placement
    nproc = args.nproc or pl.pp * pl.dp * pl.tp
    device = _device(args, nproc)
    reasons: list[str] = []
    if args.auto:
        try:
            auto = auto_place(project, nproc, device, compiled)
        except ValueError as exc:
            raise CliError(str(exc)) from None
        plan, reasons = auto.plan, auto.reasons
        if args.accept:
            apply_to_project(project, auto)
            save_project(project)
            reasons.append(f"written into {args.project}")
    elif args.accept:
        raise CliError("--accept needs --auto")
    else:
        plan = make_plan(project, nproc, device, compiled)
    from engine import calibration

    calibration.apply(plan, project)  # the newest run of this layout says how fast this machine really is
    if args.json:
        doc = plan.to_dict()
        if reasons:
            doc["reasons"] = reasons
        print(json.dumps(doc, indent=1))
    else:
        print(format_plan(plan))
        for r in reasons:
            print(f"why: {r}")
    return 1 if plan.errors else 0


def cmd_place(args) -> int:
    """The Devices panel's Assign and Set TP style, headless: a block gives what it holds."""
    from app.cli import CliError
    from engine.autoplace import PAIRS, block_tp
    from engine.compile import compile_graph
    from engine.graph import TP_STYLES, GraphError
    from engine.project import save_project

    if args.stage is None and args.tp is None:
        raise CliError("say what to set: --stage N and/or --tp STYLE")
    project = load_project(args.project)
    g = project.graph
    blocks = g.blocks()
    ids: list[str] = []
    for t in args.targets:
        if t in g.nodes:
            ids.append(t)
        elif t in blocks:
            ids.extend(g.block_members(t))
        else:
            near = sorted(b for b in blocks if b.rpartition("/")[2] == t)
            hint = f" (did you mean {', '.join(near)}?)" if near else ""
            raise CliError(f"'{t}' is neither a node nor a block of {args.project}{hint}")
    ids = list(dict.fromkeys(ids))
    changed = 0
    if args.stage is not None:
        stage = None if args.stage == "auto" else args.stage
        try:
            stage = None if stage is None else int(stage)
        except ValueError:
            raise CliError(f"--stage must be a stage number or 'auto', not '{args.stage}'") from None
        if stage is not None and not 0 <= stage < max(project.placement.pp, 1):
            raise CliError(f"--stage {stage}: the placement has {project.placement.pp} pipeline stage(s) "
                           f"(0..{project.placement.pp - 1}); set placement.pp first")
        for n in ids:
            if g.nodes[n].stage != stage:
                g.set_placement(n, stage=stage)
                changed += 1
        print(f"stage {'auto' if stage is None else stage}: {len(ids)} node(s)")
    if args.tp is not None:
        style = None if args.tp == "auto" else args.tp
        if style not in (None, PAIRS, *TP_STYLES):
            raise CliError(f"--tp '{args.tp}' is not one of {', '.join(TP_STYLES)}, pairs, auto")
        compiled = compile_graph(g)
        if not compiled.ok:
            raise CliError("the diagram has errors:\n" + "\n".join(f"  {e}" for e in compiled.errors))
        styles, skipped = block_tp(compiled, ids, style, project.placement.tp)
        try:
            for n, v in styles.items():
                if g.nodes[n].tp != v:
                    g.set_placement(n, tp=v)
                    changed += 1
        except GraphError as exc:
            raise CliError(str(exc)) from None
        for n, v in styles.items():
            print(f"  {n}: tp {v or 'auto'}")
        for t, ns in sorted(skipped.items()):
            print(f"  not {style}: {t} ({len(ns)}: {', '.join(ns[:6])}{' …' if len(ns) > 6 else ''})", file=sys.stderr)
        if style == PAIRS and not styles:
            print("  no Linear -> Linear pair (nor attention) there whose sizes the tp degree divides", file=sys.stderr)
    out = save_project(project, args.output or args.project)
    print(f"{changed} change(s) -> {out}")
    return 0
