"""validate, summary, train."""
from __future__ import annotations

import argparse
import json
import sys

from engine.compile import compile_graph
from engine.project import load_project


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="check a project: exit 0 if valid, else list every error")
    p.add_argument("project")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("summary", help="table of nodes, output shapes, parameters and FLOPs")
    p.add_argument("project")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_summary)


def cmd_validate(args) -> int:
    project = load_project(args.project)
    result = compile_graph(project.graph)
    for w in result.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if result.errors:
        for e in result.errors:
            print(f"error: {e}", file=sys.stderr)
        print(f"{args.project}: {len(result.errors)} error(s)", file=sys.stderr)
        return 1
    print(f"{args.project}: valid ({len(project.graph.nodes)} nodes, {result.total_params:,} parameters)")
    return 0


def human(n: float) -> str:
    for unit in ("", "K", "M", "G", "T", "P"):
        if abs(n) < 1000:
            return f"{n:.0f}{unit}" if unit == "" else f"{n:.2f}{unit}"
        n /= 1000
    return f"{n:.2f}E"


def cmd_summary(args) -> int:
    project = load_project(args.project)
    result = compile_graph(project.graph)
    rows = result.summary_rows()
    if args.json:
        print(json.dumps({
            "nodes": rows,
            "total_params": result.total_params,
            "total_flops": result.total_flops,
            "errors": [e.message for e in result.errors],
            "warnings": [w.message for w in result.warnings],
        }, indent=2))
        return 1 if result.errors else 0
    headers = ("node", "type", "output shape", "params", "FLOPs/sample")
    table = [(r["node"], r["type"], r["output_shape"], f"{r['params']:,}", human(r["flops"])) for r in rows]
    table.append(("total", "", "", f"{result.total_params:,}", human(result.total_flops)))
    widths = [max(len(str(x[i])) for x in [headers, *table]) for i in range(len(headers))]
    def line(cells):
        return "  ".join(str(c).ljust(w) if i < 3 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    print(line(headers))
    print("  ".join("-" * w for w in widths))
    for i, r in enumerate(table):
        if i == len(table) - 1:
            print("  ".join("-" * w for w in widths))
        print(line(r))
    for e in result.errors:
        print(f"error: {e}", file=sys.stderr)
    return 1 if result.errors else 0
