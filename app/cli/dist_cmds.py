"""plan: where each layer runs, what each device holds, what moves between them;
place: put nodes or whole blocks on a pipeline stage or give them a tensor-parallel style."""
from __future__ import annotations

import argparse
import json
import sys

from app.cli.cli_errors import CliError
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
    from app.cli.placement_flags import add_placement_flags

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


def cmd_plan(args) -> int:
    from app.cli.placement_flags import check_counts
    from layerflow import Project

    check_counts(args, "nproc")
    if args.accept and not args.auto:
        raise CliError("--accept needs --auto")
    if args.accept:  # a read-modify-write: it takes turns with the other commands and the editor
        from engine.project import editing

        with editing(args.project):
            return _plan(args, Project.load(args.project))
    return _plan(args, Project.load(args.project))


def _plan(args, project) -> int:
    from app.cli.placement_flags import placement_flags

    overrides = placement_flags(project, args)
    pl = project.placement.derive(**overrides)
    nproc = args.nproc or pl.world
    if args.auto:
        if overrides:  # the fields auto-placement leaves alone (schedule, ...) as the flags say
            project.core.placement = pl
        plan = project.autoplace(nproc, device=args.device, memory_gb=args.memory_gb)
        if args.accept:
            project.save()
            plan.reasons.append(f"written into {args.project}")
    else:
        plan = project.plan(nproc, device=args.device, memory_gb=args.memory_gb, **overrides)
    if args.json:
        doc = plan.to_dict()
        if plan.reasons:
            doc["reasons"] = plan.reasons
        print(json.dumps(doc, indent=1))
    else:
        print(plan)
        for r in plan.reasons:
            print(f"why: {r}")
    return 1 if plan.errors else 0


def cmd_place(args) -> int:
    """The Devices panel's Assign and Set TP style, headless: a block gives what it holds."""
    from engine.project import editing

    if args.stage is None and args.tp is None:
        raise CliError("say what to set: --stage N and/or --tp STYLE")
    with editing(args.output or args.project):  # a read-modify-write that takes turns with others
        return _place(args)


def _place(args) -> int:
    from engine.planning.autoplace import PAIRS, block_tp
    from engine.diagram.compile import compile_graph
    from engine.diagram.graph import TP_STYLES, GraphError
    from engine.project import save_project

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
                g.assign(n, stage=stage)
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
                    g.assign(n, tp=v)
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
