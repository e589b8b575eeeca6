import pytest
from PySide6.QtWidgets import QMessageBox

B = QMessageBox.StandardButton


@pytest.fixture
def asked(monkeypatch, tmp_path):
    """Isolated settings; every question a main window asks is recorded and answered
    (from asked["answers"] first, then Discard where offered, else the default)."""
    from app.window import MainWindow

    monkeypatch.setenv("LAYERFLOW_CONFIG_DIR", str(tmp_path / "home"))
    log = {"answers": [], "questions": []}

    def ask(self, kind, title, text, buttons, default):
        log["questions"].append((title, text))
        return log["answers"].pop(0) if log["answers"] else B.Discard if buttons & B.Discard else default

    monkeypatch.setattr(MainWindow, "ask", ask)
    return log


@pytest.fixture
def editor(qtbot):
    """A factory: the real main window with a project (a copy), shown, compiled."""
    from PySide6.QtWidgets import QApplication

    from app.window import MainWindow

    def make(project):
        w = MainWindow(project.copy())
        qtbot.addWidget(w)
        w.resize(1300, 850)
        w.show()
        qtbot.waitExposed(w)
        QApplication.processEvents()
        w.controller.flush()
        return w

    return make
