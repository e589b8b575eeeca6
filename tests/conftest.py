import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# the models written in the style of their public reference code, which tests of every room use
sys.path.insert(0, str(ROOT / "tests" / "models"))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Keep each test process to one intra-op thread: CI has 2 cores and runs 2 workers.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# engine/planning/cost.py keeps its CPU measurement in a cache folder: one of the test session's, not the user's
if "LAYERFLOW_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["LAYERFLOW_CACHE_DIR"] = tempfile.mkdtemp(prefix="layerflow-test-cache-")

import torch  # noqa: E402


torch.set_num_threads(1)


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _collect_garbage_between_tests():
    """No automatic garbage collection during a test; a full one after it, once its
    widgets are closed (this fixture is torn down after pytest-qt's). A collection that
    started inside a Qt call deleted an earlier test's dead window there: a deadlock in
    QObject::disconnect, or a segfault (app/gc_guard.py, which the app itself uses)."""
    import gc

    was = gc.isenabled()
    gc.disable()
    yield
    gc.collect()
    if was:
        gc.enable()


@pytest.fixture(autouse=True)
def _no_question_blocks_the_suite(monkeypatch):
    """A main window closed by pytest-qt's teardown with unsaved changes asks
    'Save the changes?' in a modal box that nobody answers: the worker would hang
    until the timeout. Tests that check the prompt replace `window.ask` on their
    instance (which wins over this); every other question is answered Discard."""
    import sys

    mw = sys.modules.get("app.main_window")
    if mw is None:
        return
    from PySide6.QtWidgets import QMessageBox

    monkeypatch.setattr(mw.EditorWindow, "ask",
                        lambda self, kind, title, text, buttons, default: QMessageBox.StandardButton.Discard)


@pytest.fixture(autouse=True)
def _trust_nothing(tmp_path, monkeypatch):
    """Each test starts in a process that runs no project code without consent, with a
    consent store of its own: a GUI test (an interactive process) does not leak into the
    next test of its worker."""
    from engine import trust

    monkeypatch.setenv("LAYERFLOW_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("LAYERFLOW_PROJECTS_DIR", str(tmp_path / "projects"))  # copies of the examples
    monkeypatch.setenv("LAYERFLOW_DATA_DIR", str(tmp_path / "data"))  # the examples' runs
    trust.reset_process()
    yield
    trust.reset_process()
