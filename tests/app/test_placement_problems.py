"""Placement problems are problems: the planner's findings show in the Problems dock,
badge the nodes they name and keep Run off with the reason in its tooltip, as the user
edits the Devices dock with real Qt events. Defaults that work: micro-batches follow pp,
tp on auto splits Megatron's pairs, the process box follows the placement."""
from pathlib import Path

import pytest

from app.window import MainWindow
from app.settings import Settings
from engine.project import load_project

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "resources" / "examples" / "mlp_digits.lflow"
pytestmark = [pytest.mark.gui]


@pytest.fixture
def win(qtbot, tmp_path):
    w = MainWindow(load_project(MLP), settings=Settings(tmp_path / "home"), recover=False)
    qtbot.addWidget(w)
    w.resize(1300, 850)
    w.show()
    yield w
    w.run_ui.shutdown()


def _problems(w):
    items = [w.problems.topLevelItem(i) for i in range(w.problems.topLevelItemCount())]
    return [(i.text(1), i.text(2)) for i in items]


def test_pp_2_is_valid_at_once_and_an_explicit_bad_microbatch_count_blocks_run(win, qtbot):
    w, dev = win, win.devices
    run = w.run_ui.toolbar.run_action
    assert run.isEnabled()
    dev.spins["pp"].setValue(2)  # as typed into the spin box
    w.controller.flush()
    assert w.project.placement.microbatches is None and w.controller.plan.doc["microbatches"] == 2
    assert run.isEnabled(), run.toolTip()
    assert w.run_ui.toolbar.procs.value() == 2  # the box shows the plan's processes
    assert w.controller.placement_errors == []

    dev.micro.setValue(1)  # the user asks for one micro-batch under 1F1B: cannot run
    w.controller.flush()
    probs = _problems(w)
    assert ("(placement)", next(m for _, m in probs if "needs placement.microbatches >= stages" in m)) in probs
    assert not run.isEnabled()
    assert run.toolTip().startswith("Cannot run: placement.schedule 1f1b needs placement.microbatches >= stages")
    assert w.problems_dock.windowTitle() == "Problems (1)"
    assert w.run_ui.run() is None  # F5 or a script: refused the same way, nothing launched
    assert not w.run_ui.controller.running

    w.controller.stack.undo()  # one undo step: back to auto, Run on again
    w.controller.flush()
    assert w.project.placement.microbatches is None and run.isEnabled()
    assert dev.micro.text() == "auto"


def test_a_node_the_placement_cannot_split_gets_a_badge_and_its_row(win, qtbot):
    w = win
    w.devices.spins["tp"].setValue(3)
    w.controller.set_placement(["fc1"], "tp", "colwise")  # 128 output features: 3 does not divide them
    w.controller.flush()
    rows = [(where, m) for where, m in _problems(w) if where == "fc1"]
    assert rows and "tp=3 does not divide its output features" in rows[0][1]
    item = w.scene.node_items["fc1"]
    assert item.badge is not None and item.badge.kind == "error"
    assert "tp=3 does not divide" in item.toolTip()
    assert "tp=3 does not divide" in w.run_ui.toolbar.run_action.toolTip()
    w.problems.setCurrentItem(w.problems.topLevelItem([m for _, m in _problems(w)].index(rows[0][1])))
    w.problems._clicked(w.problems.currentItem())
    assert w.scene.selected_ids() == ["fc1"]


def test_tp_2_on_auto_splits_the_mlp_as_megatron_pairs_and_shows_it_on_the_wires(win):
    w = win
    w.devices.spins["tp"].setValue(2)
    w.controller.flush()
    plan = w.controller.plan.doc
    assert {n: e["style"] for n, e in plan["tp_plan"].items()} == {"fc1": "colwise", "fc2": "rowwise"}
    assert plan["tp_auto"] == ["fc1", "fc2"]
    whole = load_project(MLP)
    from engine.diagram.compile import compile_graph

    total = compile_graph(whole.graph).total_params * 4
    held = [d["memory"]["params_bytes"] for d in plan["devices"]]
    assert all(h < total for h in held)  # each rank holds part of the model, not all of it
    labels = {(e.src, e.dst): it.note for e, it in w.scene.edge_items.items()}
    assert "tp Shard(-1)" in labels[("fc1", "act1")]
    assert w.run_ui.toolbar.run_action.isEnabled()


@pytest.mark.parametrize("field,value", [("pp", 1), ("pp", 5), ("pp", 6), ("pp", 1024), ("dp", 1024), ("tp", 1024),
                                         ("tp", 7), ("microbatches", 4096), ("schedule", "interleaved1f1b"),
                                         ("data_parallel", "fsdp")])
def test_every_placement_edge_value_is_a_problem_or_fine_never_a_crash(win, field, value):
    w = win
    w.controller.set_mesh(field, value)
    w.controller.flush()
    assert w.controller.plan is not None or w.controller.plan_error is None
    errors, _ = w.controller.problems()
    run = w.run_ui.toolbar.run_action
    assert run.isEnabled() == (not errors)
    if errors:
        assert run.toolTip() == f"Cannot run: {w.controller.run_blocker()}"


def test_many_stages_scroll_and_the_window_stays_on_the_screen(win, qtbot):
    from widgets.devices import LANES_SHOWN

    w = win
    w.show_workspace("Place")  # the Devices panel's workspace (app/workspaces.py)
    qtbot.wait(20)
    before = w.minimumSizeHint().height()
    w.devices.spins["pp"].setValue(30)
    w.controller.flush()
    qtbot.wait(50)
    assert len(w.devices.lanes.lanes) >= 30
    assert w.devices.lanes_scroll.height() <= LANES_SHOWN * 46 + 6
    assert w.devices.lanes_scroll.verticalScrollBar().maximum() > 0  # the rest scrolls
    assert w.minimumSizeHint().height() <= max(before, 900) and w.height() <= 900


def test_save_as_names_the_project_and_the_toolbar_keeps_its_width(qtbot, tmp_path, asked):
    from PySide6.QtCore import Qt

    from engine.project import Project

    w = MainWindow(Project(), settings=Settings(tmp_path / "home"), recover=False)
    qtbot.addWidget(w)
    w.show()
    tb = w.main_toolbar
    undo_button = tb.widgetForAction(w.actions["undo"])
    assert undo_button.toolButtonStyle() == Qt.ToolButtonIconOnly
    width = tb.sizeHint().width()
    w.controller.add_node("Linear", (0, 0))
    assert "Undo Add" in w.actions["undo"].text() and tb.sizeHint().width() == width
    assert w.project.name == "untitled"
    assert w.save_as(tmp_path / "my_mlp.lflow")
    assert w.project.name == "my_mlp" and load_project(tmp_path / "my_mlp.lflow").name == "my_mlp"
    assert w.windowTitle().startswith("my_mlp.lflow")


def test_a_new_projects_input_matches_its_data_set_and_auto_layout_shows_everything(qtbot, tmp_path):
    from engine.project import Project

    w = MainWindow(Project(), settings=Settings(tmp_path / "home"), recover=False)
    qtbot.addWidget(w)
    w.resize(1200, 800)
    w.show()
    c = w.controller
    x = c.add_node("Input", (0, 0))
    ds = w.project.training.dataset
    assert w.project.graph.nodes[x].params["shape"] == [ds.n_features]  # 32 features, not the palette's 64
    second = c.add_node("Input", (0, 200))
    assert w.project.graph.nodes[second].params == {}  # only the first Input follows the data set
    fc = c.add_node("Linear", (4000, 3000))  # far away: off the screen
    c.connect_ports(x, "out", fc, "in")
    c.flush()
    w.view.set_zoom(3.0)
    w.auto_layout()
    visible = w.view.visible_scene_rect()
    for nid in (x, second, fc):
        assert visible.contains(w.scene.node_items[nid].sceneBoundingRect()), nid


def test_projects_sharing_a_folder_list_only_their_own_runs(qtbot, tmp_path):
    from engine.project import save_project
    from engine.runs.build import prepare_run

    folder = tmp_path / "work"
    folder.mkdir()
    a = load_project(MLP)
    a.name = "alpha"
    save_project(a, folder / "alpha.lflow")
    b = load_project(MLP)
    b.name = "beta"
    save_project(b, folder / "beta.lflow")
    prepare_run(load_project(folder / "alpha.lflow"), folder / "runs" / "alpha-1", steps=1)
    prepare_run(load_project(folder / "beta.lflow"), folder / "runs" / "beta-1", steps=1)
    w = MainWindow(load_project(folder / "alpha.lflow"), settings=Settings(tmp_path / "home"), recover=False)
    qtbot.addWidget(w)
    w.run_ui.refresh()
    assert [s.name for s in w.run_ui.runs_panel._summaries.values()] == ["alpha"]
    w.set_project(load_project(folder / "beta.lflow"))
    w.run_ui.refresh()
    assert [s.name for s in w.run_ui.runs_panel._summaries.values()] == ["beta"]
    w.run_ui.shutdown()


def test_ctrl_z_in_a_panel_field_undoes_the_edit_and_typed_numbers_are_one_step(win, qtbot):
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QSpinBox

    w = win
    w.select_and_show("fc1")
    w.inspector_dock.raise_()
    field = w.inspector.findChild(QSpinBox, "out_features")
    field.setFocus()
    field.selectAll()
    qtbot.keyClicks(field, "96")
    qtbot.keyClick(field, Qt.Key_Return)
    assert w.project.graph.nodes["fc1"].params["out_features"] == 96
    qtbot.keyClick(field, Qt.Key_Z, Qt.ControlModifier)  # in the field: the project's undo, not the text's
    assert w.project.graph.nodes["fc1"].params["out_features"] == 128

    spin = w.devices.spins["pp"]
    w.devices_dock.raise_()
    spin.setFocus()
    spin.selectAll()
    qtbot.keyClicks(spin, "12")  # 1 -> 1 (ignored), 1 -> 12: one edit, named after the value it ends with
    assert w.project.placement.pp == 12
    assert w.actions["undo"].text() == "&Undo Set pp = 12"
    qtbot.keyClick(spin, Qt.Key_Z, Qt.ControlModifier)
    assert w.project.placement.pp == 1


def test_rename_follows_the_models_id_rule_and_a_planner_failure_is_an_error(win, monkeypatch):
    w = win
    assert not w.controller.rename("fc1", "class")  # a keyword: fx could not name it
    assert not w.controller.rename("fc1", "x" * 300)
    assert "fc1" in w.project.graph.nodes
    assert w.controller.rename("fc1", "encoder_in")

    import engine.planning.planner as planner

    def broken(*a, **k):
        raise TypeError("a bug in the planner")

    monkeypatch.setattr(planner, "make_plan", broken)
    w.controller.compile_now()
    assert w.controller.plan is None
    errors, _ = w.controller.problems()
    assert any("the plan failed: TypeError: a bug in the planner" in e.message for e in errors)
    assert not w.run_ui.toolbar.run_action.isEnabled()


def test_settings_replaced_outside_an_undo_command_reach_the_views(win, qtbot):
    """The project's own events carry training and placement changes, whoever makes them
    (here a script or plug-in assigning them directly): the plan and the Devices dock follow."""
    w = win
    w.project.placement = w.project.placement.derive(pp=2)
    w.controller.flush()
    assert w.controller.plan.doc["microbatches"] == 2 and w.devices.spins["pp"].value() == 2
    w.project.training = w.project.training.model_copy(update={"batch_size": 32})
    w.controller.flush()
    assert w.controller.plan.doc["batch"]["global"] == 32
