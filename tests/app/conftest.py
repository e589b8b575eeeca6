import pytest
from PySide6.QtWidgets import QMessageBox

B = QMessageBox.StandardButton


@pytest.fixture
def asked(monkeypatch, tmp_path):
    """Isolated settings; every question a main window asks is recorded and answered
    (from asked["answers"] first, then Discard where offered, else the default)."""
    from app.main_window import MainWindow

    monkeypatch.setenv("LAYERFLOW_CONFIG_DIR", str(tmp_path / "home"))
    log = {"answers": [], "questions": []}

    def ask(self, kind, title, text, buttons, default):
        log["questions"].append((title, text))
        return log["answers"].pop(0) if log["answers"] else B.Discard if buttons & B.Discard else default

    monkeypatch.setattr(MainWindow, "ask", ask)
    return log
