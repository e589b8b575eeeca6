"""`python main.py screenshot`: the real main window rendered offscreen to a PNG."""
from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtGui import QImage

from app.cli import main
from engine.diagram.graph import Graph
from engine.project import Project, save_project

pytestmark = pytest.mark.gui


@pytest.fixture
def project_file(tmp_path):
    g = Graph()
    g.add_node("Input", {"shape": [8]}, pos=(0, 0), id="x")
    g.add_node("Linear", {"out_features": 4}, pos=(240, 0), id="fc")
    g.add_node("Output", {}, pos=(480, 0), id="y")
    g.connect("x", "out", "fc", "in")
    g.connect("fc", "out", "y", "in")
    return save_project(Project(g, name="tiny"), tmp_path / "tiny.lflow")


def test_screenshot_writes_the_window_in_both_themes(qtbot, project_file, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LAYERFLOW_CONFIG_DIR", str(tmp_path / "home"))
    out = tmp_path / "shots" / "light.png"
    assert main(["screenshot", str(project_file), "-o", str(out), "--size", "1500x900", "--select", "fc"]) == 0
    img = QImage(str(out))
    assert (img.width(), img.height()) == (1500, 900)
    dark = tmp_path / "dark.png"
    assert main(["screenshot", str(project_file), "-o", str(dark), "--size", "1500x900", "--theme", "dark"]) == 0
    # the canvas above the diagram (the window's centre is on the node fc, in the canvas's middle)
    light_px, dark_px = QImage(str(out)).pixelColor(750, 130), QImage(str(dark)).pixelColor(750, 130)
    assert light_px.lightness() > dark_px.lightness() + 80
    assert "wrote" in capsys.readouterr().out
    # a workspace: Place puts the Devices panel where Design has the Inspector, so the two differ
    place = tmp_path / "place.png"
    assert main(["screenshot", str(project_file), "-o", str(place), "--size", "1440x900", "--workspace", "Place"]) == 0
    design = tmp_path / "design.png"
    assert main(["screenshot", str(project_file), "-o", str(design), "--size", "1440x900", "--workspace", "Design"]) == 0
    assert QImage(str(place)).size() == QImage(str(design)).size() and QImage(str(place)) != QImage(str(design))


def test_screenshot_errors_are_one_line(project_file, tmp_path, capsys):
    assert main(["screenshot", str(project_file), "-o", str(tmp_path / "x.png"), "--select", "nope"]) == 2
    assert "no node named 'nope'" in capsys.readouterr().err
    assert main(["screenshot", str(tmp_path / "missing.lflow"), "-o", str(tmp_path / "x.png")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_start_project_is_the_last_one_or_the_example(tmp_path, monkeypatch, project_file):
    monkeypatch.setenv("LAYERFLOW_CONFIG_DIR", str(tmp_path / "home"))
    from app.cli import CliError
    from app.cli.gui_cmds import _start_path
    from app.main_window import EXAMPLE
    from app.settings import Settings

    assert _start_path(None) == (str(EXAMPLE) if EXAMPLE.exists() else None)
    Settings().add_recent(project_file)
    assert Path(_start_path(None)).resolve() == project_file.resolve()
    assert _start_path(str(project_file)) == str(project_file)
    with pytest.raises(CliError, match="no such file"):
        _start_path(str(tmp_path / "missing.lflow"))


def test_opening_an_unreadable_file_shows_the_window_with_the_reason(qtbot, tmp_path, monkeypatch):
    """`main.py open BAD.lflow`: the window opens and says why the file cannot be read."""
    monkeypatch.setenv("LAYERFLOW_CONFIG_DIR", str(tmp_path / "home"))
    from PySide6.QtWidgets import QApplication

    from app.cli import gui_cmds as cli_gui
    from app.window import MainWindow

    bad = tmp_path / "bad.lflow"
    bad.write_text('{"format_version": 1, "training": {"seed": -1}}')
    asked = []
    monkeypatch.setattr(MainWindow, "ask", lambda self, kind, title, text, buttons, default: asked.append((title, text)) or default)
    monkeypatch.setattr(QApplication, "exec", lambda self: 0)
    assert cli_gui.cmd_open(type("A", (), {"project": str(bad)})()) == 0
    wins = [w for w in QApplication.topLevelWidgets() if isinstance(w, MainWindow) and w.isVisible()]
    assert wins and asked and asked[-1][0] == "Cannot open project" and "training.seed" in asked[-1][1]
    for w in wins:
        w.close()


def test_layout_command_lays_the_diagram_out_left_to_right(project_file, tmp_path):
    from engine.project import load_project

    out = tmp_path / "laid.lflow"
    assert main(["layout", str(project_file), "-o", str(out)]) == 0
    g = load_project(out).graph
    assert g.nodes["x"].pos[0] < g.nodes["fc"].pos[0] < g.nodes["y"].pos[0]
    assert load_project(project_file).graph.nodes["fc"].pos == (240.0, 0.0)  # -o left the source alone
