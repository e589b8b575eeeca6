"""File > Import: one dialog for an ONNX file or a PyTorch module (issue 42, item 6),
driven through the real window: fields checked as typed with the error under each, Import
enabled only for a whole form, the import on a worker thread with its phases shown while
the window's event loop keeps running, errors inline with the dialog still open, Cancel
that stops waiting and opens nothing."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import onnx
import pytest
import shiboken6
import torch
from onnx import TensorProto, helper, numpy_helper
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication

from app.import_dialog import ImportDialog, parse_kwargs, parse_shape, source_kind
from engine.diagram.compile import compile_graph
from engine.interop import progress
from engine.project import load_project

import real_models  # noqa: E402

EX = Path(__file__).resolve().parents[2] / "resources" / "examples"
pytestmark = pytest.mark.gui


@pytest.fixture
def w(qtbot, asked):
    from app.window import MainWindow

    w = MainWindow(load_project(EX / "mlp_digits.lflow"), recover=False)
    qtbot.addWidget(w)
    w.resize(1300, 850)
    w.show()
    qtbot.waitExposed(w)
    return w


def open_dialog(qtbot, w, **kw) -> ImportDialog:
    dlg = w.interop_ui.import_dialog(**kw)
    qtbot.waitExposed(dlg)
    return dlg


def closed(dlg) -> bool:
    """Closed (and maybe deleted already: the dialog is deleted on close)."""
    return not shiboken6.isValid(dlg) or not dlg.isVisible()


def tiny_onnx(path: Path) -> Path:
    """x (N, 4) -> Gemm(4 -> 3) -> Relu: an ONNX file made here with onnx.helper."""
    wt = numpy_helper.from_array(torch.randn(3, 4).numpy(), "w")
    b = numpy_helper.from_array(torch.randn(3).numpy(), "b")
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["h"], transB=1), helper.make_node("Relu", ["h"], ["y"])],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], initializer=[wt, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def test_fields_are_checked_as_typed(qtbot, w, tmp_path):
    dlg = open_dialog(qtbot, w)
    # nothing typed yet: no error, but Import waits for a source
    assert not dlg.import_button.isEnabled() and not dlg.source_note.styleSheet().startswith("color: #c62828")
    assert "choose a source" in dlg.why.text()

    qtbot.keyClicks(dlg.source, "real_models:ResNet")
    assert dlg.inputs_box.isEnabled() and dlg.kwargs.isEnabled()
    assert dlg.output.text() == str(dlg.folder / "ResNet.lflow")  # the default, in the last-used folder
    dlg.output.setText(str(tmp_path / "resnet.lflow"))
    dlg.rows[0].shape.setText("3,16,16")
    assert dlg.import_button.isEnabled()

    # invalid JSON: the error under the field, Import disabled; fixed: enabled again
    dlg.kwargs.setPlainText('{"width": 8,}')
    assert dlg.kwargs_note.isVisible() and "not valid JSON" in dlg.kwargs_note.text()
    assert "line 1" in dlg.kwargs_note.text()
    assert not dlg.import_button.isEnabled() and "arguments" in dlg.why.text()
    dlg.kwargs.setPlainText("[8]")
    assert "JSON object" in dlg.kwargs_note.text() and not dlg.import_button.isEnabled()
    dlg.kwargs.setPlainText('{"width": 8}')
    assert not dlg.kwargs_note.isVisible() and dlg.import_button.isEnabled()

    # a shape row: typed wrong, shown; rows added and removed
    dlg.rows[0].shape.setText("3,a,16")
    assert "input 1" in dlg.inputs_note.text() and not dlg.import_button.isEnabled()
    dlg.rows[0].shape.setText("3,16,16")
    qtbot.mouseClick(dlg.add_input_button, Qt.LeftButton)
    assert len(dlg.rows) == 2 and not dlg.import_button.isEnabled()  # the new row has no shape yet
    dlg.rows[1].dtype.setCurrentText("int64")
    dlg.rows[1].shape.setText("8")
    req = dlg.validate()
    assert req.shapes == [[3, 16, 16], [8]] and req.dtypes == ["float32", "int64"] and req.kwargs == {"width": 8}
    qtbot.mouseClick(dlg.rows[1].remove, Qt.LeftButton)
    assert len(dlg.rows) == 1 and not dlg.rows[0].remove.isEnabled()  # the last row stays

    # source errors as typed
    dlg.source.setText("not a path")
    assert "package.module:Class" in dlg.source_note.text() and not dlg.import_button.isEnabled()
    dlg.source.setText("no_such_package_xyz.models:Net")
    assert "no module named 'no_such_package_xyz'" in dlg.source_note.text()
    dlg.source.setText(str(tmp_path / "missing.onnx"))
    assert "no such file" in dlg.source_note.text()
    dlg.output.setText(str(tmp_path / "nowhere" / "x.lflow"))
    assert "no such folder" in dlg.output_note.text()


def test_parsers():
    assert parse_shape("3, 224,224") == [3, 224, 224] and parse_shape("3x32x32") == [3, 32, 32]
    for bad in ("", "3,-1", "a"):
        with pytest.raises(ValueError):
            parse_shape(bad)
    assert parse_kwargs("") == {} and parse_kwargs('{"a": [1, 2]}') == {"a": [1, 2]}
    assert source_kind("pkg.mod:Class")[0] == "module" and source_kind("m.onnx")[0] == "onnx"
    assert source_kind("file.py")[1] and source_kind("")[1] is None


def test_module_import_runs_off_the_gui_thread_and_opens(qtbot, w, tmp_path):
    target = tmp_path / "resnet.lflow"
    dlg = open_dialog(qtbot, w, source="real_models:ResNet50", project_path=target)
    dlg.kwargs.setPlainText('{"layers": [1, 2, 3, 1]}')
    dlg.rows[0].shape.setText("3,32,32")
    assert dlg.import_button.isEnabled()

    phases, ticks, gui = [], [], threading.get_ident()
    dlg.phase_changed.connect(lambda name, detail: phases.append(name))
    tick = QTimer(interval=20, timeout=lambda: ticks.append((time.monotonic(), dlg.running)))
    tick.start()
    qtbot.mouseClick(dlg.import_button, Qt.LeftButton)
    job = dlg.job
    assert job is not None and job.thread.ident != gui and dlg.bar.isVisible()
    assert not dlg.form_box.isEnabled() and not dlg.import_button.isEnabled()
    qtbot.waitUntil(lambda: w.project.path == target, timeout=120_000)
    tick.stop()

    # the event loop ran while the worker imported (an import on the GUI thread ticks never;
    # how often it ticks depends on the machine's load: torch.export holds the GIL for long
    # stretches, and on 2 busy cores a tick can wait seconds)
    assert sum(1 for _, running in ticks if running) >= 1
    assert phases[0] == "loading" and {"tracing", "converting", "checking", "writing"} <= set(phases)
    assert not job.thread.is_alive() or job.thread.join(5) is None
    qtbot.waitUntil(lambda: closed(dlg) and w.interop_ui.dialog is None, timeout=10_000)  # closed on success
    assert "Imported resnet.lflow" in w.statusBar().currentMessage()
    assert w.project.weights and (target.parent / w.project.weights).exists()
    n = sum(p.numel() for p in real_models.ResNet50(layers=(1, 2, 3, 1)).parameters())
    assert compile_graph(w.project.graph).total_params == n
    assert w.settings.value("import_folder") == str(tmp_path)  # the next import starts here
    again = open_dialog(qtbot, w, source="real_models:GPT")
    assert again.output.text() == str(tmp_path / "GPT.lflow")
    again.close()


def test_onnx_import_through_the_dialog(qtbot, w, tmp_path):
    src = tiny_onnx(tmp_path / "tiny.onnx")
    dlg = open_dialog(qtbot, w, source=str(src))
    assert dlg.output.text() == str(tmp_path / "tiny.lflow")  # beside the file
    assert not dlg.inputs_box.isEnabled() and not dlg.kwargs.isEnabled()  # they come from the file
    dlg.kwargs.setPlainText("{not json")  # not asked for an ONNX file: no reason to refuse
    assert dlg.import_button.isEnabled()
    qtbot.mouseClick(dlg.import_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: w.project.path == tmp_path / "tiny.lflow", timeout=60_000)
    assert compile_graph(w.project.graph).total_params == 3 * 4 + 3
    assert w.windowTitle().startswith("tiny") or "tiny" in w.windowTitle()


def test_errors_show_inline_and_the_dialog_stays_open(qtbot, w, tmp_path):
    before = w.project
    dlg = open_dialog(qtbot, w, source="real_models:NoSuchModel", project_path=tmp_path / "x.lflow")
    dlg.rows[0].shape.setText("3,16,16")
    assert dlg.import_button.isEnabled()  # the module exists: the class is looked up by the import
    qtbot.mouseClick(dlg.import_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: dlg.error.isVisible(), timeout=30_000)
    assert "cannot import 'real_models:NoSuchModel'" in dlg.error.text() and "\n" not in dlg.error.text()
    assert dlg.isVisible() and dlg.form_box.isEnabled() and dlg.import_button.isEnabled()
    assert w.project is before and not (tmp_path / "x.lflow").exists()

    # fix the source, pass the wrong shape: the model's own error, in one line
    dlg.source.setText("real_models:ResNet")
    dlg.rows[0].shape.setText("5,16,16")
    qtbot.mouseClick(dlg.import_button, Qt.LeftButton)
    assert not dlg.error.isVisible()  # an old error goes when the next import starts
    qtbot.waitUntil(lambda: dlg.error.isVisible(), timeout=60_000)
    assert "failed" in dlg.error.text() and "(3, 5, 16, 16)" in dlg.error.text()
    assert dlg.isVisible() and w.project is before

    # an ONNX file that is not one
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    dlg.source.setText(str(bad))
    qtbot.mouseClick(dlg.import_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: dlg.error.isVisible(), timeout=30_000)
    assert "bad.onnx" in dlg.error.text() and dlg.isVisible() and w.project is before

    # an ONNX file whose declared input dims disagree with its first layer: the node and the input, in one line
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    dims = tmp_path / "dims.onnx"
    graph = helper.make_graph([helper.make_node("Gemm", ["x", "W"], ["y"], name="fc1", transB=1)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.ones((128, 64), np.float32), "W")])
    dims.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    dlg.source.setText(str(dims))
    qtbot.mouseClick(dlg.import_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: dlg.error.isVisible() and "dims.onnx" in dlg.error.text(), timeout=60_000)
    text = dlg.error.text()
    assert "node 'fc1' (Gemm)" in text and "declares input 'x' as [1, 64, 1]" in text and "\n" not in text, text
    assert dlg.isVisible() and w.project is before


def test_cancel_stops_waiting_and_opens_nothing(qtbot, w, tmp_path, monkeypatch):
    import app.import_dialog as import_dialog

    release = threading.Event()
    real = import_dialog.run_import

    def slow(req):  # the import blocks in its tracing phase until the test lets it go
        progress.phase("tracing", "held by the test")
        release.wait(30)
        return real(req)

    monkeypatch.setattr(import_dialog, "run_import", slow)
    target = tmp_path / "cancelled.lflow"
    before = w.project
    dlg = open_dialog(qtbot, w, source="real_models:ResNet", project_path=target)
    dlg.rows[0].shape.setText("3,16,16")
    qtbot.mouseClick(dlg.import_button, Qt.LeftButton)
    job = dlg.job
    qtbot.waitUntil(lambda: "Tracing" in dlg.status.text(), timeout=10_000)
    qtbot.mouseClick(dlg.cancel_button, Qt.LeftButton)
    # no more waiting: the form is back at once, the dialog still open
    assert dlg.job is None and dlg.isVisible() and dlg.form_box.isEnabled() and dlg.import_button.isEnabled()
    assert "Cancelled" in dlg.status.text() and not dlg.bar.isVisible()
    release.set()
    job.thread.join(60)
    assert not job.thread.is_alive()
    assert ("cancelled",) in list(job.events.queue)  # it stopped at its next phase
    for _ in range(5):
        QApplication.processEvents()
    assert w.project is before and not target.exists() and not (tmp_path / "cancelled.weights.pt").exists()

    # Cancel with nothing running closes the dialog
    qtbot.mouseClick(dlg.cancel_button, Qt.LeftButton)
    assert closed(dlg)


def test_cancelled_after_writing_takes_back_its_files(tmp_path):
    from app.import_dialog import ImportJob, Request

    target = tmp_path / "late.lflow"
    job = ImportJob(Request("module", "real_models:ResNet", target, {}, [[3, 16, 16]], ["float32"]))
    orig = job._phase

    def phase(name, detail):
        orig(name, detail)
        if name == "writing":
            job.cancel()  # after its last phase: the files get written, then removed

    job._phase = phase
    job.start()
    job.thread.join(120)
    assert list(job.events.queue)[-1] == ("cancelled",)
    assert not target.exists() and not (tmp_path / "late.weights.pt").exists()


def test_menu_and_drop_open_the_dialog(qtbot, w, tmp_path, monkeypatch):
    import app.import_dialog as import_dialog

    monkeypatch.setattr(import_dialog.QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: ("", "")))
    w.interop_ui.actions["import_module"].trigger()
    dlg = w.interop_ui.dialog
    assert isinstance(dlg, ImportDialog) and dlg.isVisible()
    src = tiny_onnx(tmp_path / "dropped.onnx")
    dlg2 = w.interop_ui.import_onnx_file(src)  # as a drop on the canvas does
    assert dlg2 is w.interop_ui.dialog and dlg2.source.text() == str(src) and dlg2.import_button.isEnabled()


def test_a_python_file_as_the_source(qtbot, w, tmp_path):
    (tmp_path / "mynet.py").write_text(
        "import torch\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self, hidden=6):\n"
        "        super().__init__()\n"
        "        self.fc1, self.fc2 = torch.nn.Linear(4, hidden), torch.nn.Linear(hidden, 2)\n"
        "    def forward(self, x):\n"
        "        return self.fc2(torch.relu(self.fc1(x)))\n")
    dlg = open_dialog(qtbot, w, source=str(tmp_path / "mynet.py"))
    assert "name the class" in dlg.source_note.text() and not dlg.import_button.isEnabled()
    dlg.source.setText(f"{tmp_path / 'mynet.py'}:Net")
    dlg.rows[0].shape.setText("4")
    dlg.kwargs.setPlainText('{"hidden": 5}')
    dlg.output.setText(str(tmp_path / "mynet.lflow"))
    assert dlg.import_button.isEnabled()
    qtbot.mouseClick(dlg.import_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: w.project.path == tmp_path / "mynet.lflow", timeout=60_000)
    assert compile_graph(w.project.graph).total_params == 4 * 5 + 5 + 5 * 2 + 2
    assert w.project.description == f"Imported from {tmp_path / 'mynet.py'}:Net"


def test_a_long_error_has_its_details(qtbot, w, tmp_path):
    from engine.interop import InteropError

    dlg = open_dialog(qtbot, w)
    dlg._set_error(InteropError("cannot import X: 2 call(s) cannot be represented:\n  - a\n  - b"))
    assert dlg.error.text() == "cannot import X: 2 call(s) cannot be represented:"
    assert dlg.details_button.isVisible() and not dlg.details.isVisible()
    qtbot.mouseClick(dlg.details_button, Qt.LeftButton)
    assert dlg.details.isVisible() and "  - b" in dlg.details.toPlainText()


def test_a_new_import_waits_for_the_cancelled_one(qtbot, w, tmp_path, monkeypatch):
    import app.import_dialog as import_dialog

    release = threading.Event()
    real = import_dialog.run_import

    def slow(req):
        progress.phase("tracing", "held by the test")
        release.wait(30)
        return real(req)

    monkeypatch.setattr(import_dialog, "run_import", slow)
    dlg = open_dialog(qtbot, w, source="real_models:ResNet", project_path=tmp_path / "first.lflow")
    dlg.rows[0].shape.setText("3,16,16")
    qtbot.mouseClick(dlg.import_button, Qt.LeftButton)
    first = dlg.job
    qtbot.waitUntil(lambda: "Tracing" in dlg.status.text(), timeout=10_000)
    qtbot.mouseClick(dlg.cancel_button, Qt.LeftButton)
    dlg.output.setText(str(tmp_path / "second.lflow"))
    qtbot.mouseClick(dlg.import_button, Qt.LeftButton)  # while the first still runs on its thread
    qtbot.waitUntil(lambda: "Waiting" in dlg.status.text(), timeout=10_000)
    release.set()
    qtbot.waitUntil(lambda: w.project.path == tmp_path / "second.lflow", timeout=120_000)
    first.thread.join(30)
    assert not (tmp_path / "first.lflow").exists()


def test_escape_while_importing_cancels_it(qtbot, w, tmp_path, monkeypatch):
    import app.import_dialog as import_dialog

    release = threading.Event()
    real = import_dialog.run_import

    def slow(req):
        progress.phase("tracing", "held by the test")
        release.wait(30)
        return real(req)

    monkeypatch.setattr(import_dialog, "run_import", slow)
    before = w.project
    dlg = open_dialog(qtbot, w, source="real_models:ResNet", project_path=tmp_path / "esc.lflow")
    dlg.rows[0].shape.setText("3,16,16")
    qtbot.mouseClick(dlg.import_button, Qt.LeftButton)
    job = dlg.job
    qtbot.keyClick(dlg, Qt.Key_Escape)
    assert closed(dlg) and job.cancelled.is_set()
    release.set()
    job.thread.join(60)
    for _ in range(5):
        QApplication.processEvents()
    assert w.project is before and not (tmp_path / "esc.lflow").exists()


def test_everything_given_imports_at_once(qtbot, w, tmp_path):
    """The calls behind the menu, with every answer given (scripts): no dialog."""
    ui = w.interop_ui
    out = ui.import_module_path("real_models:ResNet", {"width": 4}, [3, 16, 16], tmp_path / "now.lflow")
    assert out == tmp_path / "now.lflow" and w.project.path == out and ui.dialog is None
    assert ui.import_module_path("real_models:Nope", {}, [3, 16, 16], tmp_path / "nope.lflow") is None
    assert "Nope" in w.statusBar().currentMessage() and w.project.path == out
    dlg = ui.import_module_path("real_models:ResNet", {"width": 4})  # no shape: the dialog, prefilled
    assert isinstance(dlg, ImportDialog) and parse_kwargs(dlg.kwargs.toPlainText()) == {"width": 4}
