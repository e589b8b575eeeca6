"""Screenshots for issue 42 items 5, 7 and 8 (part): the dashboard and the canvas at 1440x900.

    xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python docs/screenshots/shoot_issue42.py TAG RUN_A RUN_B

writes docs/screenshots/{dashboard,compare,canvas-fit,canvas-topdown,canvas-expanded,canvas-auto-cut}-1440-TAG.png.
RUN_A, RUN_B: two finished runs of resources/examples/cnn_digits.lflow
(`python main.py train resources/examples/cnn_digits.lflow --steps 30 --out DIR`).
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "engine"))
os.environ["LAYERFLOW_CONFIG_DIR"] = tempfile.mkdtemp(prefix="layerflow-shot-")

from PySide6.QtWidgets import QApplication  # noqa: E402

OUT = ROOT / "docs" / "screenshots"


def settle(app, n=8):
    for _ in range(n):
        app.processEvents()


def window(app, project):
    from app.window import MainWindow

    w = MainWindow(project, recover=False)
    w.resize(1440, 900)
    w.show()
    settle(app)
    w.default_dock_sizes()
    w.controller.flush()
    settle(app)
    return w


def shot(app, w, name, tag):
    settle(app)
    w.view.minimap._render()
    settle(app)
    path = OUT / f"{name}-1440-{tag}.png"
    w.grab().save(str(path), "PNG")
    print("wrote", path)


def main() -> None:
    tag, run_a, run_b = sys.argv[1], sys.argv[2], sys.argv[3]
    parts = sys.argv[4] if len(sys.argv) > 4 else "dashboard,canvas"
    app = QApplication.instance() or QApplication(sys.argv)
    from engine.interop.module.importer import from_module
    from engine.project import load_project
    from real_models import ResNet50

    if "dashboard" in parts:
        dashboard(app, tag, run_a, run_b, load_project(ROOT / "resources" / "examples" / "cnn_digits.lflow"))
    if "canvas" in parts:
        canvas(app, tag, from_module(ResNet50(layers=(1, 2, 3, 1)), [[3, 32, 32]], name="resnet50").project)


def dashboard(app, tag, run_a, run_b, digits):
    w = window(app, digits)
    w.open_run(run_a)
    settle(app, 20)
    shot(app, w, "dashboard", tag)
    w.run_ui.compare(run_a, run_b)
    w.run_ui.dashboard.wait_parsed()
    w.run_ui.dashboard.flush()
    settle(app, 20)
    shot(app, w, "compare", tag)
    w.controller.stack.setClean()
    w.close()


def canvas(app, tag, resnet):
    w = window(app, resnet)
    w.actions["fit"].trigger()
    shot(app, w, "canvas-fit", tag)
    w.actions["top_down"].trigger()
    settle(app)
    shot(app, w, "canvas-topdown", tag)
    w.controller.stack.undo()
    settle(app)
    shot(app, w, "canvas-undo-direction", tag)
    card = w.scene.group_items.get("layer1")
    if card is not None:
        w.controller.toggle_block("layer1")
        settle(app)
        w.actions["fit"].trigger()
        shot(app, w, "canvas-expanded", tag)
    # the automatic cut: two pipeline stages, no stage assigned by the user
    w.controller.set_mesh("pp", 2)
    settle(app, 20)
    w.controller.flush()
    settle(app, 20)
    shot(app, w, "canvas-auto-cut", tag)
    w.controller.stack.setClean()
    w.close()


if __name__ == "__main__":
    main()
