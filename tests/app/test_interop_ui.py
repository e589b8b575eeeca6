"""File menu import/export and an .onnx file dropped on the canvas, through a real
window: the same engine/interop calls as the CLI, the slow export off the GUI thread
(the import dialog itself: test_import_dialog.py)."""
from pathlib import Path

import onnx
import pytest
import torch
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication

from app.window import MainWindow
from app.settings import Settings
from engine.diagram.compile import compile_graph
from engine.project import load_project

EX = Path(__file__).resolve().parents[2] / "resources" / "examples"
pytestmark = pytest.mark.gui


@pytest.fixture
def window(qtbot, tmp_path):
    w = MainWindow(load_project(EX / "mlp_digits.lflow"), settings=Settings(tmp_path / "home"), recover=False)
    qtbot.addWidget(w)
    w.resize(1200, 800)
    w.show()
    return w


def test_menu_actions_exist(window):
    texts = [a.text() for a in window.menuBar().actions()[0].menu().actions()]
    for t in ("Import &ONNX…", "Import PyTorch &Module…", "&Export ONNX…", "Export PyTorch &Script…"):
        assert t in texts


def test_export_onnx_then_drop_it_on_the_canvas(qtbot, window, tmp_path, monkeypatch):
    ui = window.interop_ui
    onnx_path = tmp_path / "mlp.onnx"
    fut = ui.export_onnx_to(onnx_path)
    qtbot.waitUntil(fut.done, timeout=120_000)  # the window stayed responsive meanwhile
    qtbot.waitUntil(lambda: "Wrote" in window.statusBar().currentMessage(), timeout=5000)
    onnx.checker.check_model(onnx.load(str(onnx_path)))

    target = tmp_path / "imported.lflow"
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(onnx_path))])
    vp = window.view.viewport()
    p = vp.rect().center()
    enter = QDragEnterEvent(p, Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier)
    QApplication.sendEvent(vp, enter)
    assert enter.isAccepted()  # the canvas takes .onnx files
    drop = QDropEvent(QPointF(p), Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier)
    QApplication.sendEvent(vp, drop)
    assert drop.isAccepted()
    # the import dialog opens with the file as its source; Import runs it off the GUI thread
    qtbot.waitUntil(lambda: ui.dialog is not None and ui.dialog.isVisible(), timeout=5000)
    assert ui.dialog.source.text() == str(onnx_path)
    ui.dialog.output.setText(str(target))
    ui.dialog.import_button.click()
    qtbot.waitUntil(lambda: window.project.path == target, timeout=30_000)

    original = load_project(EX / "mlp_digits.lflow")
    assert window.project.weights and (target.parent / window.project.weights).exists()
    assert compile_graph(window.project.graph).total_params == compile_graph(original.graph).total_params
    state = torch.load(target.parent / window.project.weights, weights_only=True)
    assert sum(v.numel() for v in state.values()) == compile_graph(original.graph).total_params


def test_export_script_and_a_bad_onnx_file(window, tmp_path):
    ui = window.interop_ui
    out = ui.export_script_to(tmp_path / "train_mlp.py")
    assert "class Model" in out.read_text()
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    before = window.project
    assert ui.import_onnx_file(bad, tmp_path / "x.lflow") is None
    assert window.project is before and not (tmp_path / "x.lflow").exists()
    assert "bad.onnx" in window.statusBar().currentMessage()  # the reason, naming the file
