"""The Data dock on a real (offscreen) main window, with data generated here (Pillow
images in class subfolders, numpy token files): a chosen folder or file is one undo step
in which the Input takes the data's shape; the panel shows counts, shapes, the class
histogram, example images or decoded text and the loader's speed, read off the GUI
thread; a mismatch between data and model is a problem on its node before Run."""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtWidgets import QApplication

from engine.diagram.graph import Graph
from engine.project import Project
from widgets.data_panel import guess_kind

Image = pytest.importorskip("PIL.Image")
pytestmark = pytest.mark.gui
COLOURS = ((220, 40, 40), (40, 200, 60), (50, 70, 230))


@pytest.fixture
def editor(editor):
    """The window (tests/app/conftest.py) in Train, the Data panel's workspace, the panel in front."""
    from PySide6.QtWidgets import QApplication

    def make(project):
        w = editor(project)
        w.show_workspace("Train")
        w.data_dock.raise_()
        QApplication.processEvents()
        return w

    return make


def make_images(root: Path, per_class=(6, 9, 3), size=20, split=False) -> Path:
    rng = np.random.default_rng(0)
    for c, colour in enumerate(COLOURS):
        d = root / ("train" if split else "") / f"class_{c}"
        d.mkdir(parents=True, exist_ok=True)
        for k in range(per_class[c]):
            a = np.clip(rng.normal(colour, 40, (size, size, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(a).save(d / f"{k:03d}.png")
    return root


def make_tokens(root: Path, n=5000, vocab=256) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    text = ("the quick brown fox jumps over the lazy dog. " * (n // 40 + 1)).encode()[:n]
    np.frombuffer(text, dtype=np.uint8).astype(np.uint16).tofile(root / "train.bin")
    np.frombuffer(text[: n // 5], dtype=np.uint8).astype(np.uint16).tofile(root / "val.bin")
    (root / "meta.json").write_text(json.dumps({"vocab_size": vocab, "dtype": "uint16", "tokenizer": "byte"}))
    return root


def image_model(classes=3) -> Project:
    g = Graph()
    g.add_node("Input", {"shape": [8], "dtype": "float32"}, id="x")
    g.add_node("Flatten", {}, id="flat")
    g.add_node("Linear", {"out_features": classes}, id="head")
    g.add_node("Output", {"loss": "cross_entropy"}, id="out")
    g.connect("x", "out", "flat", "in")
    g.connect("flat", "out", "head", "in")
    g.connect("head", "out", "out", "in")
    p = Project(g, name="images")
    p.training.batch_size = 4  # the test sets hold 18 images: a larger batch is a problem of its own
    return p


def token_model(vocab=100) -> Project:
    g = Graph()
    g.add_node("Input", {"shape": [8], "dtype": "float32"}, id="x")
    g.add_node("Embedding", {"num_embeddings": vocab, "embedding_dim": 8}, id="emb")
    g.add_node("Linear", {"out_features": 256}, id="head")
    g.add_node("Output", {"loss": "cross_entropy"}, id="out")
    g.connect("x", "out", "emb", "in")
    g.connect("emb", "out", "head", "in")
    g.connect("head", "out", "out", "in")
    return Project(g, name="tokens")


def settle(w, qtbot) -> None:
    """The worker done and its results delivered; the diagram compiled."""
    for _ in range(3):
        assert w.data_ui.wait(60000)
        w.controller.wait_for_data()
        QApplication.processEvents()
    w.controller.flush()
    w.controller.wait_for_data()
    QApplication.processEvents()


def data_errors(w) -> list:
    return [e for e in w.controller.problems()[0] if e.field == "training.dataset"]


def test_guess_kind_from_the_path(tmp_path):
    assert guess_kind(make_images(tmp_path / "flat")) == "image_folder"
    assert guess_kind(make_images(tmp_path / "split", split=True)) == "image_folder"
    toks = make_tokens(tmp_path / "toks")
    assert guess_kind(toks) == guess_kind(toks / "train.bin") == "token_file"
    for name, kind in (("a.parquet", "parquet"), ("a.arrow", "parquet"), ("a.npz", "array"), ("a.npy", "array"),
                       ("s-000.tar", "shards"), ("notes.txt", None)):
        (tmp_path / name).write_bytes(b"")
        assert guess_kind(tmp_path / name) == kind, name
    (tmp_path / "empty").mkdir()
    assert guess_kind(tmp_path / "empty") is None


def test_an_image_folder_is_one_undo_step_and_the_panel_shows_it(qtbot, asked, editor, tmp_path):
    root = make_images(tmp_path / "colours")
    w = editor(image_model())
    panel, stack = w.data_panel, w.controller.stack
    steps = stack.count()
    t0 = time.perf_counter()
    assert w.data_ui.choose(str(root))  # what the folder dialog does
    assert time.perf_counter() - t0 < 1.0  # the data is read on the worker, not here
    assert panel.progress.isVisible() or panel.report is not None
    settle(w, qtbot)

    p = w.project
    d = p.training.dataset
    assert d.kind == "image_folder" and Path(d.path) == root.resolve()
    assert d.image_size == 20  # the images' own size, not 224
    assert p.graph.nodes["x"].params["shape"] == [3, 20, 20]  # the Input follows the data
    assert stack.count() == steps + 1  # one step: data set and Input together
    assert panel.kind() == "image_folder"

    # what the panel shows
    assert panel.report is not None and not panel.progress.isVisible()
    total = 6 + 9 + 3
    n_train, n_val = panel.report["samples"]["train"], panel.report["samples"]["val"]
    assert n_train + n_val == total and n_val >= 1
    assert panel.fields["samples"].text() == f"{n_train} / {n_val}"
    assert "[3, 20, 20]" in panel.fields["x"].text() and "float32" in panel.fields["x"].text()
    assert panel.fields["classes"].text() == "3"
    assert panel.report["histogram"]["counts"] and sum(panel.report["histogram"]["counts"]) == n_train
    assert panel.bars is not None and list(panel.bars.opts["height"]) == panel.report["histogram"]["counts"]
    assert "3 classes" in panel.hist_note.text()
    plain = [t for t in panel.thumbs if t.objectName() == "thumb_image"]
    augmented = [t for t in panel.thumbs if t.objectName() == "thumb_image_augmented"]
    assert len(plain) == len(augmented) == 4 and all(not t.pixmap().isNull() for t in panel.thumbs)
    assert "samples/s" in panel.fields["speed"].text()
    assert panel.report["throughput"]["samples_per_s"] > 0
    assert not panel.fit_widget.isVisible()  # the Input fits
    assert data_errors(w) == []

    # undo takes back both; the panel follows the project
    stack.undo()
    settle(w, qtbot)
    assert w.project.training.dataset.kind == "synthetic_classification"
    assert w.project.graph.nodes["x"].params["shape"] == [8]
    assert "generated" in panel.status.text() and not panel.summary_box.isVisible()
    stack.redo()
    settle(w, qtbot)
    assert w.project.training.dataset.kind == "image_folder"
    assert w.project.graph.nodes["x"].params["shape"] == [3, 20, 20]
    assert panel.report is not None and panel.fields["classes"].text() == "3"


def test_a_mismatch_is_a_problem_on_the_node_before_run_read_once(qtbot, asked, editor, tmp_path, monkeypatch):
    import engine.data.describe

    calls = []
    describe = engine.data.describe.describe_source
    monkeypatch.setattr(engine.data.describe, "describe_source", lambda *a, **k: calls.append(1) or describe(*a, **k))
    root = make_images(tmp_path / "colours")
    w = editor(image_model(classes=5))  # 5 outputs, 3 classes
    w.data_ui.choose(str(root))
    settle(w, qtbot)
    errs = data_errors(w)
    assert [e.node for e in errs] == ["head"], errs
    assert "3 classes" in errs[0].message
    badge = w.scene.node_items["head"].badge  # the node's badge, like the compiler's problems
    assert badge is not None and "3 classes" in badge.toolTip()
    assert w.problems_dock.windowTitle() == "Problems (1)"
    assert w.controller.run_blocker() and "head" in w.controller.run_blocker()
    n = len(calls)

    # edits re-check against the cached description, never reading the data again
    w.controller.set_param("head", "out_features", 3)
    settle(w, qtbot)
    assert data_errors(w) == []
    w.controller.set_param("x", "shape", [3, 16, 16])  # the Input no longer fits
    settle(w, qtbot)
    errs = data_errors(w)
    assert [e.node for e in errs] == ["x"] and "[3, 20, 20]" in errs[0].message
    assert w.data_panel.fit_widget.isVisible() and "[3, 16, 16]" in w.data_panel.fit_label.text()
    assert len(calls) == n

    # the panel offers the fix: one undo step
    steps = w.controller.stack.count()
    w.data_panel.fit_button.click()
    settle(w, qtbot)
    assert w.project.graph.nodes["x"].params["shape"] == [3, 20, 20]
    assert w.controller.stack.count() == steps + 1 and data_errors(w) == []
    assert not w.data_panel.fit_widget.isVisible()
    assert len(calls) == n


def test_a_token_file_shows_decoded_text_and_checks_the_vocabulary(qtbot, asked, editor, tmp_path):
    root = make_tokens(tmp_path / "corpus")
    w = editor(token_model(vocab=100))
    w.data_ui.choose(str(root))
    settle(w, qtbot)
    d = w.project.training.dataset
    assert d.kind == "token_file"
    x = w.project.graph.nodes["x"].params
    assert x["shape"] == [d.seq_len] and x["dtype"] == "int64"  # shape and dtype follow, one step
    panel = w.data_panel
    assert panel.text.isVisible() and "quick brown fox" in panel.text.toPlainText()
    assert "256" in panel.fields["classes"].text() and panel.summary.labelForField(panel.fields["classes"]).text() == "vocabulary"
    errs = data_errors(w)
    assert [e.node for e in errs] == ["emb"] and "num_embeddings" in errs[0].message
    assert not panel.hist_box.isVisible()


def test_a_stale_selection_is_dropped_and_a_bad_one_changes_nothing(qtbot, asked, editor, tmp_path):
    a = make_images(tmp_path / "a")
    b = make_images(tmp_path / "b", per_class=(2, 2, 2), size=12)
    w = editor(image_model())
    stack = w.controller.stack
    steps = stack.count()
    w.data_ui.choose(str(a))
    w.data_ui.choose(str(b))  # before a is read: a's result must not land
    settle(w, qtbot)
    assert Path(w.project.training.dataset.path) == b.resolve()
    assert stack.count() == steps + 1
    assert w.project.graph.nodes["x"].params["shape"] == [3, 12, 12]
    assert w.data_panel.report["samples"]["train"] + w.data_panel.report["samples"]["val"] == 6

    empty = tmp_path / "nothing"
    empty.mkdir()
    before = w.project.training
    assert not w.data_ui.choose(str(empty))
    settle(w, qtbot)
    assert w.project.training == before and stack.count() == steps + 1
    assert w.data_panel.error.isVisible() and "kind" in w.data_panel.error.text()
    # an explicit kind the path is not: one line, nothing changed but the panel
    w.data_panel.choose(str(empty), "token_file")
    settle(w, qtbot)
    assert w.data_panel.error.isVisible() and "bin" in w.data_panel.error.text()
    assert w.project.training == before and stack.count() == steps + 1
