"""Every action reachable (issue 42, item 2) and one truth for the device count (item 3),
driven through the real main window at the size the issue was found at (1440x900)."""
from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QApplication, QMenu, QToolButton, QWidgetAction
from shiboken6 import getCppPointer

from app.window import MainWindow
from engine.project import load_project, save_project

pytestmark = pytest.mark.gui
ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "resources" / "examples"


@pytest.fixture
def win(qtbot, asked, tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERFLOW_PROJECTS_DIR", str(tmp_path / "projects"))
    p = load_project(EX / "mlp_digits.lflow")
    path = tmp_path / "proj" / "mlp.lflow"
    path.parent.mkdir()
    save_project(p, path)
    w = MainWindow(load_project(path), recover=False)
    qtbot.addWidget(w)
    w.resize(1440, 900)
    w.show()
    qtbot.waitExposed(w)
    QApplication.processEvents()
    w.controller.flush()
    yield w
    w.run_ui.shutdown()


def key(a) -> int:
    return getCppPointer(a)[0]  # (Python wrappers of one C++ action may differ)


def menu_actions(w) -> dict[int, str]:
    """the action's address -> its menu path, for every action a menu of the menu bar shows."""
    found: dict[int, str] = {}

    def walk(menu: QMenu, path: str) -> None:
        menu.aboutToShow.emit()  # menus filled as they open (Run, Open Recent) are filled
        for a in menu.actions():
            if a.menu() is not None:
                walk(a.menu(), f"{path} > {a.text()}")
            elif not a.isSeparator():
                found[key(a)] = f"{path} > {a.text()}"

    for top in w.menuBar().actions():
        if top.menu() is not None and top.isVisible():
            walk(top.menu(), top.text().replace("&", ""))
    return found


def test_every_toolbar_action_is_in_a_menu_at_1440(win):
    w = win
    assert w.width() == 1440
    in_menus = menu_actions(w)
    overflowed = []
    for bar in (w.main_toolbar, w.run_toolbar):
        ext = bar.findChild(QToolButton, "qt_toolbar_ext_button")
        for a in bar.actions():
            if a.isSeparator():
                continue
            button = bar.widgetForAction(a)
            shown = button is not None and button.isVisible() and button.geometry().right() <= bar.width()
            if isinstance(a, QWidgetAction):  # a box (find, target, processes): on the bar or behind its arrow
                assert shown or (ext is not None and ext.isVisible()), a.defaultWidget()
            else:
                assert key(a) in in_menus, f"toolbar action {a.text()!r} is in no menu"
            if not shown:
                overflowed.append(a.text())
    # the Run menu is the run toolbar's own actions, in its order, with their shortcuts;
    # then the sweep's (Sweep…, Runs Table), which have no button
    everything = [a for a in w.run_menu.actions() if not a.isSeparator()]
    assert [a.text() for a in everything] == ["Run", "Stop", "Resume", "Logs", "Clusters…", "Deploy…",
                                              "S&weep…", "Runs &Table"]
    assert everything[6:] == w.sweep_ui.actions
    run_menu = everything[:6]
    tb = w.run_ui.toolbar
    assert run_menu[:4] == [tb.run_action, tb.stop_action, tb.resume_action, tb.logs_action]
    assert all(a in w.run_toolbar.actions() for a in run_menu)
    keys = {a.text(): a.shortcut().toString() for a in run_menu}
    assert keys["Run"] == "F5" and keys["Stop"] == "Shift+F5" and all(keys.values()), keys
    # enabled together: they are one action
    tb.set_running(True)
    assert run_menu[1].isEnabled() and not run_menu[0].isEnabled()
    tb.set_running(False)
    assert not run_menu[1].isEnabled()
    # what did not fit is behind a visible arrow that is drawn (the theme's padding left it blank)
    if overflowed:
        ext = w.run_toolbar.findChild(QToolButton, "qt_toolbar_ext_button")
        assert ext.isVisible()
        img = ext.grab().toImage()
        colours = {img.pixel(x, y) for x in range(img.width()) for y in range(img.height())}
        assert len(colours) > 2, "the overflow arrow is not drawn"
    # Help: shortcuts and getting started
    help_texts = [a.text() for a in w.help_menu.actions()]
    assert "&Keyboard Shortcuts" in help_texts and "&Getting Started" in help_texts


def test_no_two_actions_share_a_shortcut(win):
    seen: dict[str, str] = {}
    for a in win.findChildren(QAction):
        for k in a.shortcuts():
            if k.isEmpty() or not a.isVisible() or a.parent() is None:
                continue
            s = k.toString()
            assert s not in seen or seen[s] == a.text(), f"{s}: {seen.get(s)!r} and {a.text()!r}"
            seen[s] = a.text()


def test_shortcuts_dialog_lists_the_actions_as_they_are(win, qtbot):
    w = win
    w.help_menu.aboutToShow.emit()
    w.actions["shortcuts"].trigger()
    dlg = w.shortcuts_dialog
    qtbot.waitExposed(dlg)
    rows = dlg.rows()
    assert ("Run", "F5", "Run") in rows
    assert ("Stop", "Shift+F5", "Run") in rows
    assert ("Save", QKeySequence(QKeySequence.Save).toString(QKeySequence.NativeText), "File") in rows
    assert any(r[0] == "Deploy…" and r[2] == "Run" for r in rows)
    dlg.filter.setText("shift+f5")
    assert [r[0] for r in dlg.rows()] == ["Stop"]
    dlg.close()
    # generated from the actions: a shortcut changed now is listed at the next opening
    w.run_ui.toolbar.logs_action.setShortcut(QKeySequence("Ctrl+Alt+G"))
    w.actions["shortcuts"].trigger()
    assert ("Logs", "Ctrl+Alt+G", "Run") in w.shortcuts_dialog.rows()
    w.shortcuts_dialog.close()


def test_the_shortcuts_list_is_every_command_of_the_menus(win, qtbot):
    """Help ▸ Keyboard Shortcuts lists every command the menus have, with its keys or none,
    and no file of Open Recent or Examples; Sweep… and Runs Table have keys of their own."""
    from app.help_ui import _plain

    def commands(menu, path):
        for a in menu.actions():
            if a.isSeparator() or isinstance(a, QWidgetAction) or not a.isVisible():
                continue
            if a.menu() is not None:
                if not a.menu().property("lf_file_list"):
                    yield from commands(a.menu(), f"{path} ▸ {_plain(a.text())}")
            else:
                yield (_plain(a.text()), path)

    for top in win.menuBar().actions():
        if top.menu() is not None:
            top.menu().aboutToShow.emit()  # (menus filled when shown)
    want = {c for top in win.menuBar().actions() if top.menu() is not None and top.isVisible()
            for c in commands(top.menu(), _plain(top.text()))}
    win.actions["shortcuts"].trigger()
    rows = win.shortcuts_dialog.rows()
    assert want <= {(r[0], r[2]) for r in rows}, want - {(r[0], r[2]) for r in rows}
    keys = {r[0]: r[1] for r in rows}
    assert keys["Sweep…"] and keys["Runs Table"]
    assert not [r for r in rows if r[2].startswith(("File ▸ Open Recent", "File ▸ Examples"))]
    win.shortcuts_dialog.close()


def test_getting_started_page(win, qtbot):
    win.actions["getting_started"].trigger()
    dlg = win.getting_started_dialog
    qtbot.waitExposed(dlg)
    text = dlg.text.toPlainText()
    for step in ("1. Design", "2. Data", "3. Train", "4. Export", "5. Deploy"):
        assert step in text
    assert "Run ▸ Run (F5)" in text and "Run ▸ Clusters…" in text and "Run ▸ Deploy…" in text
    dlg.close()


def test_logs_with_no_run_says_so(win, qtbot):
    win.run_ui.toolbar.logs_action.trigger()
    assert "No run of" in win.statusBar().currentMessage()


# ----- item 3: one truth for the device count -------------------------------------------
def test_toolbar_processes_are_the_placement_the_devices_panel_the_plan_and_the_run(win, qtbot, monkeypatch):
    w = win
    tb = w.run_ui.toolbar
    assert tb.procs.value() == 1 and w.project.placement.world == 1
    tb.procs.setValue(2)  # as the user sets it on the toolbar
    w.controller.flush()
    pl = w.project.placement
    assert (pl.pp, pl.dp, pl.tp) == (1, 2, 1)
    assert w.devices.spins["dp"].value() == 2 and w.devices.world.text().startswith("2 ")
    assert w.controller.plan is not None and w.controller.plan.nproc == 2 and w.controller.plan.run.dp == 2
    assert len(w.controller.plan.devices) == 2  # the plan's rows: one per device
    assert w.summary.devices.rowCount() == 2  # the Summary's device table, as shown
    assert [w.summary.devices.item(i, 0).text() for i in range(2)] == ["rank 0 (dp 0, tp 0)", "rank 1 (dp 1, tp 0)"]
    assert w.devices.plan_view.isVisibleTo(w.devices) and "dp=2" in w.devices.plan_view.toPlainText().replace(" ", "")
    assert w.is_dirty()  # a change of the project (saved with it), one undo step
    # Run builds its spec with the same layout (the launch itself is left out)
    import app.run_controller as rc

    launched = {}

    def fake_launch(run_dir, nproc, resume=False):
        from engine.runtime.spec import RunSpec

        spec = RunSpec.load(run_dir)
        launched.update(nproc=nproc, dp=spec.plan.dp, pp=spec.plan.pp, tp=spec.plan.tp, world=spec.world)
        raise ValueError("not launched in this test")

    monkeypatch.setattr(rc, "launch_local", fake_launch)
    assert tb.run_action.isEnabled(), tb.run_action.toolTip()
    tb.run_action.trigger()
    qtbot.waitUntil(lambda: bool(launched), timeout=60_000)
    qtbot.waitUntil(lambda: not w.run_ui.controller.running, timeout=30_000)
    assert launched == {"nproc": 2, "dp": 2, "pp": 1, "tp": 1, "world": 2}
    if w.run_ui.failure_box is not None:
        w.run_ui.failure_box.close()

    # and the other way: the Devices panel's dp shows on the toolbar. Edits of one
    # field within MERGE_S seconds are one undo step (typing "12"); the run above may
    # take less than that on a fast machine, so this edit is made to count as later.
    import app.undo_commands as C

    monkeypatch.setattr(C.SetProjectPlacement, "MERGE_S", -1.0)
    w.devices.spins["dp"].setValue(3)
    w.controller.flush()
    assert tb.procs.value() == 3 and w.project.placement.world == 3
    # undo takes the toolbar back too
    w.controller.stack.undo()
    w.controller.flush()
    assert tb.procs.value() == 2 and w.project.placement.dp == 2


def test_a_count_the_placement_cannot_take_is_refused_with_the_reason(win):
    w = win
    w.devices.spins["pp"].setValue(2)
    w.controller.flush()
    tb = w.run_ui.toolbar
    assert tb.procs.value() == 2
    tb.procs.setValue(3)  # not a multiple of pp 2 x tp 1
    assert tb.procs.value() == 2 and w.project.placement.world == 2
    assert "multiple of 2" in w.statusBar().currentMessage()
    tb.procs.setValue(4)  # pp kept, dp 2
    w.controller.flush()
    pl = w.project.placement
    assert (pl.pp, pl.dp, pl.tp) == (2, 2, 1) and w.devices.world.text().startswith("4 ")


def test_typed_counts_and_large_placements_show_on_the_toolbar(win, qtbot):
    w = win
    tb = w.run_ui.toolbar
    box = tb.procs
    box.lineEdit().selectAll()
    qtbot.keyClicks(box.lineEdit(), "4")
    assert w.project.placement.dp == 1  # not while typing
    qtbot.keyClick(box.lineEdit(), Qt.Key_Return)
    w.controller.flush()
    assert w.project.placement.dp == 4 and w.devices.spins["dp"].value() == 4
    w.devices.spins["dp"].setValue(16)  # more than the box offered at first
    w.controller.flush()
    assert box.value() == 16 == w.project.placement.world
