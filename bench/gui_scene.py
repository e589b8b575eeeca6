"""Node editor speed on a 1,000-node diagram (offscreen).

Prints: time to build the scene, to paint one frame at fit-view and at 100%
zoom, and to undo a 100-node paste. Goals (issue 4): build < 1 s, frame < 30 ms.
Run: python bench/gui_scene.py [--nodes 1000]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from PySide6.QtCore import QPointF  # noqa: E402
from PySide6.QtGui import QImage, QPainter  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from engine.diagram.graph import Graph  # noqa: E402


def big_graph(n: int) -> Graph:
    """Rows of residual MLP blocks: Linear -> ReLU -> Linear -> Add(skip)."""
    g = Graph()
    g.add_node("Input", {"shape": [64]}, pos=(0, 0), id="x")
    prev, i, col, row = "x", 0, 1, 0
    while len(g.nodes) < n - 1:
        ids = [f"l{i}a", f"r{i}", f"l{i}b", f"add{i}"]
        for k, (nid, t) in enumerate(zip(ids, ("Linear", "ReLU", "Linear", "Add"))):
            g.add_node(t, {"out_features": 64} if t == "Linear" else {}, pos=(col * 230.0, row * 160.0 + (k % 2) * 60), id=nid)
            col += 1
            if col > 40:
                col, row = 1, row + 1
        g.connect(prev, "out", ids[0], "in")
        g.connect(ids[0], "out", ids[1], "in")
        g.connect(ids[1], "out", ids[2], "in")
        g.connect(ids[2], "out", ids[3], "a")
        g.connect(prev, "out", ids[3], "b")
        prev, i = ids[3], i + 1
    g.add_node("Output", {"loss": "mse"}, pos=(col * 230.0, row * 160.0), id="y")
    g.connect(prev, "out", "y", "in")
    return g


def frame_ms(view, repeats: int = 9) -> float:
    img = QImage(view.viewport().size(), QImage.Format_ARGB32_Premultiplied)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        p = QPainter(img)
        view.render(p)
        p.end()
        times.append((time.perf_counter() - t) * 1000)
    return min(times)  # the least disturbed frame: other processes share the 2 cores


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    args = ap.parse_args()
    app = QApplication.instance() or QApplication([])
    from app.controller import EditorController
    from engine.project import Project
    from widgets.node_scene import NodeScene
    from widgets.node_view import NodeView

    g = big_graph(args.nodes)
    t = time.perf_counter()
    scene = NodeScene(g)
    build_s = time.perf_counter() - t
    view = NodeView(scene)
    view.resize(1400, 900)
    view.show()
    app.processEvents()
    view.fit()
    fit_ms = frame_ms(view)
    view.set_zoom(1.0)
    view.centerOn(QPointF(2000, 300))
    full_ms = frame_ms(view)
    # undo of a 100-node paste, through the controller and the undo stack
    ctl = EditorController(Project(g.copy()))
    ctl.compile_now()
    sub_ids = list(ctl.graph.nodes)[1:101]
    t = time.perf_counter()
    ctl.insert_subgraph(ctl.graph.subgraph_dict(sub_ids), QPointF(0, 5000), "Paste")
    paste_s = time.perf_counter() - t
    t = time.perf_counter()
    ctl.stack.undo()
    undo_s = time.perf_counter() - t
    t = time.perf_counter()
    ctl.compile_now()
    compile_s = time.perf_counter() - t
    rows = [
        ("build scene", f"{build_s * 1000:.0f} ms", "< 1000 ms", build_s < 1.0),
        ("frame at fit view", f"{fit_ms:.1f} ms", "< 30 ms", fit_ms < 30),
        ("frame at 100% zoom", f"{full_ms:.1f} ms", "< 30 ms", full_ms < 30),
        ("paste 100 nodes", f"{paste_s * 1000:.0f} ms", "", True),
        ("undo 100-node paste", f"{undo_s * 1000:.0f} ms", "", True),
        ("compile (after the edit)", f"{compile_s * 1000:.0f} ms", "debounced", True),
    ]
    print(f"node editor, {len(g.nodes)} nodes, {len(g.edges)} edges ({os.environ['QT_QPA_PLATFORM']})")
    print(f"{'measure':28s} {'time':>10s} {'goal':>10s}  ok")
    for name, val, goal, ok in rows:
        print(f"{name:28s} {val:>10s} {goal:>10s}  {'yes' if ok else 'NO'}")


if __name__ == "__main__":
    main()
