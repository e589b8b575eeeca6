"""The Devices panel cannot set a placement the model refuses (issue 40, item 2): its
boxes offer the Placement fields' bounds, and an edit that would make pp x dp x tp more
than MAX_PROCESSES is not taken: the box goes back to the valid value and the panel
says why. Driven with the real spin boxes of the real window (setValue and keys)."""
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.settings import Settings
from app.window import MainWindow
from engine.project import MAX_PROCESSES, Placement, load_project

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "resources" / "examples" / "mlp_digits.lflow"
pytestmark = [pytest.mark.gui]


@pytest.fixture
def win(qtbot, tmp_path):
    w = MainWindow(load_project(MLP), settings=Settings(tmp_path / "home"), recover=False)
    qtbot.addWidget(w)
    w.resize(1300, 850)
    w.show()
    w.show_workspace("Place")  # the Devices panel's workspace (app/workspaces.py)
    yield w
    w.run_ui.shutdown()


def _type(qtbot, spin, text: str) -> None:
    spin.setFocus()
    spin.selectAll()
    qtbot.keyClicks(spin, text)
    qtbot.keyClick(spin, Qt.Key_Return)


def test_the_boxes_offer_what_the_model_allows(win):
    dev = win.devices
    for key in ("pp", "dp", "tp"):
        assert (dev.spins[key].minimum(), dev.spins[key].maximum()) == Placement.bounds(key) == (1, MAX_PROCESSES)
    assert dev.micro.maximum() == Placement.bounds("microbatches")[1]
    assert tuple(dev.schedule.itemText(i) for i in range(dev.schedule.count())) == Placement.choices("schedule")
    assert tuple(dev.dpmode.itemText(i) for i in range(dev.dpmode.count())) == Placement.choices("data_parallel")


def test_dp_and_tp_at_1024_is_refused_and_the_panel_says_why(win, qtbot):
    w, dev = win, win.devices
    dev.spins["dp"].setValue(1024)  # 1,024 processes: taken
    assert w.project.placement.dp == 1024 and not dev.mesh_error.isVisible()
    dev.spins["tp"].setValue(1024)  # 1,048,576 processes: 16x the limit
    pl = w.project.placement
    assert (pl.dp, pl.tp, pl.world) == (1024, 1, 1024)  # the project's placement is untouched, and valid
    Placement.model_validate(pl.model_dump())
    assert dev.spins["tp"].value() == 1  # the box shows the valid value again
    why = dev.mesh_error.text()
    assert dev.mesh_error.isVisible() and why.startswith("placement.tp: pp x dp x tp = 1,048,576 processes")
    assert "at most 65,536" in why
    assert why in dev.spins["tp"].toolTip() and why not in dev.spins["dp"].toolTip()
    assert w.actions["undo"].text() == "&Undo Set dp = 1024"  # the refused edit is no undo step

    # typed: tp 64 is taken (65,536 processes, the limit itself); the message goes
    _type(qtbot, dev.spins["tp"], "64")
    assert (w.project.placement.tp, w.project.placement.world) == (64, MAX_PROCESSES)
    assert not dev.mesh_error.isVisible() and "Not taken" not in dev.spins["tp"].toolTip()

    # typed: pp 2 would double it; every key stroke is checked, none gets through
    _type(qtbot, dev.spins["pp"], "2")
    assert w.project.placement.pp == 1 and dev.spins["pp"].value() == 1
    assert dev.mesh_error.text().startswith("placement.pp: pp x dp x tp = 131,072 processes")
    w.controller.flush()
    assert w.project.placement.world == MAX_PROCESSES and dev.world.text().startswith(f"{MAX_PROCESSES}  ")


def test_typing_1024_into_both_boxes_never_leaves_the_limit(win, qtbot):
    w, dev = win, win.devices
    _type(qtbot, dev.spins["dp"], "1024")
    _type(qtbot, dev.spins["tp"], "1024")  # 1, 10 taken; 102 and 104 refused as they are typed
    pl = w.project.placement
    assert pl.dp == 1024 and pl.world <= MAX_PROCESSES and dev.spins["tp"].value() == pl.tp
    assert dev.mesh_error.isVisible() and "at most 65,536" in dev.mesh_error.text()


def test_the_panel_alone_checks_against_the_placement_it_shows(qtbot):
    """Without a window: the panel refuses from the placement set_state gave it."""
    from widgets.devices import DevicesPanel

    panel = DevicesPanel()
    qtbot.addWidget(panel)
    sent = []
    panel.mesh_edited.connect(lambda k, v: sent.append((k, v)))
    panel.set_state(Placement(pp=2, dp=256), {}, [])
    panel.spins["tp"].setValue(256)  # 131,072
    assert sent == [] and panel.spins["tp"].value() == 1 and "131,072 processes" in panel.mesh_error.text()
    panel.spins["tp"].setValue(128)  # 65,536: taken, and the panel follows it though nobody answered
    panel.spins["pp"].setValue(3)
    assert sent == [("tp", 128)] and panel.spins["pp"].value() == 2
