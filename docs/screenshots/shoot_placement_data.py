"""Screenshots for issue 42 items 4 and 8 at 1440x900: data problems before Run, and
placement feedback in the user's terms.

    xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python docs/screenshots/shoot_placement_data.py TAG [OUT_DIR]

writes {placement-cut,placement-error,data-problems}-1440-TAG.png into OUT_DIR (default:
docs/screenshots). Run from an older checkout (with this script copied in) for "before".
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ["LAYERFLOW_CONFIG_DIR"] = tempfile.mkdtemp(prefix="layerflow-shot-")

from PySide6.QtWidgets import QApplication


def settle(app, w=None, n=8):
    for _ in range(n):
        app.processEvents()
        if w is not None:
            w.controller.flush()
            if hasattr(w.controller, "wait_for_data"):
                w.controller.wait_for_data(10000)


def window(app, project):
    from app.window import MainWindow

    w = MainWindow(project, recover=False)
    w.resize(1440, 900)
    w.show()
    settle(app)
    w.default_dock_sizes()
    settle(app, w)
    return w


def shot(app, w, name, tag, out):
    settle(app, w)
    path = out / f"{name}-1440-{tag}.png"
    w.grab().save(str(path), "PNG")
    print("wrote", path)


def main() -> None:
    tag = sys.argv[1]
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "docs" / "screenshots"
    app = QApplication.instance() or QApplication(sys.argv)
    from tests.app.test_block_placement import two_blocks

    # 8: pp=2, nothing placed: the planner cuts the model itself
    w = window(app, two_blocks())
    w.devices_dock.raise_()
    w.devices.spins["pp"].setValue(2)
    shot(app, w, "placement-cut", tag, out)
    # 8: the user puts the blocks on stages against the data flow
    g = w.project.graph
    w.controller.set_placement(g.block_members("head"), "stage", 0)
    w.controller.set_placement(g.block_members("mlp"), "stage", 1)
    w.problems_dock.raise_()
    shot(app, w, "placement-error", tag, out)
    w.controller.stack.setClean()  # (no "save changes?" question)
    w.hide()

    # 4: the digits MLP (64 features, 10 outputs) given a generated set of 32 features,
    # 4 classes, then the npz kind chosen with no path typed yet
    from engine.project import load_project

    p = load_project(ROOT / "resources" / "examples" / "mlp_digits.lflow")
    p.path = None
    w = window(app, p)
    w.training_dock.raise_()
    panel = w.training_panel
    kind = panel.editors[("training", "dataset", "kind")].widget
    kind.setCurrentText("synthetic_classification")
    settle(app, w)
    kind.setCurrentText("npz")
    shot(app, w, "data-problems", tag, out)


if __name__ == "__main__":
    main()
