"""Run and watch from the real main window: start a local run of an example with the
toolbar, see points arrive in the plot, stop it and find no training process left,
resume it; history that survives a restart, two runs overlaid, CSV export equal to
metrics.jsonl, delete with confirmation, the failure dialog naming the node, and the
screenshot command with --run."""
import csv
import json
import os
from pathlib import Path

import pytest
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QMessageBox

from app.window import MainWindow
from app.run_controller import group_pids
from app.settings import Settings
from engine.project import load_project, save_project
from engine.runs.build import new_run_dir, prepare_run
from engine.runs.history import summarize_run
from engine.runtime.train import run
from engine.runs.tail import read_metrics

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "resources" / "examples"
pytestmark = [pytest.mark.gui, pytest.mark.slow, pytest.mark.xdist_group("run_ui")]


@pytest.fixture
def project_path(tmp_path):
    p = load_project(EX / "mlp_digits.lflow")
    p.training.steps = 100_000  # long enough to be stopped halfway
    p.training.eval_interval = 5
    p.training.checkpoint_interval = 5
    path = tmp_path / "proj" / "mlp.lflow"
    path.parent.mkdir()
    save_project(p, path)
    return path


@pytest.fixture
def open_window(qtbot, tmp_path):
    windows = []

    def make(path):
        w = MainWindow(load_project(path), settings=Settings(tmp_path / "home"), recover=False)
        qtbot.addWidget(w)
        w.resize(1400, 900)
        w.show()
        windows.append(w)
        return w

    yield make
    for w in windows:  # never leave a training process behind, whatever failed
        w.run_ui.shutdown()


def processes_mentioning(text: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def loss_points(ui, run_dir) -> int:
    c = ui.dashboard.curve(str(run_dir), "loss")
    return 0 if c is None or c.getOriginalDataset()[0] is None else len(c.getOriginalDataset()[0])


def test_run_from_the_toolbar_stop_and_resume(qtbot, open_window, project_path):
    w = open_window(project_path)
    ui = w.run_ui
    texts = [a.text() for a in w.run_toolbar.actions()]  # other areas add theirs too
    assert texts.index("Run") < texts.index("Stop") < texts.index("Resume")
    ui.toolbar.run_action.trigger()
    assert ui.controller.running and not ui.toolbar.run_action.isEnabled()
    active = ui.controller.active
    run_dir = active.run_dir
    assert run_dir.parent == project_path.parent / "runs"
    qtbot.waitUntil(lambda: active.job is not None, timeout=60_000)  # prepared in the background, then launched
    pgid = active.pgid
    assert active.command[-3:-1] == ["-m", "engine.runtime.train"] and active.command[-1] == str(run_dir)

    qtbot.waitUntil(lambda: loss_points(ui, run_dir) >= 3, timeout=120_000)
    assert ui.progress.isVisible() and ui.progress.format().startswith("step ")
    assert ui.progress.maximum() == 100_000
    assert str(run_dir) in ui.runs_panel.run_paths()

    ui.toolbar.stop_action.trigger()
    qtbot.waitUntil(lambda: not ui.controller.running, timeout=60_000)
    assert group_pids(pgid) == [] and processes_mentioning(str(run_dir)) == []
    s = summarize_run(run_dir)
    assert s.state == "cancelled" and (run_dir / "checkpoints" / "latest").is_file()
    assert ui.notifications[-1].startswith(f"Run {run_dir.name} cancelled")
    assert not ui.progress.isVisible() and ui.toolbar.resume_action.isEnabled()

    stopped_at = s.step
    ui.toolbar.resume_action.trigger()
    assert ui.controller.running and ui.controller.active.resume
    qtbot.waitUntil(lambda: ui.controller.active.job is not None, timeout=60_000)
    pgid2 = ui.controller.active.pgid
    assert ui.controller.active.command[-1] == "--resume"
    qtbot.waitUntil(lambda: any(r.get("step", 0) > stopped_at for r in ui.dashboard.records(str(run_dir))),
                    timeout=120_000)
    ui.stop()
    qtbot.waitUntil(lambda: not ui.controller.running, timeout=60_000)
    assert group_pids(pgid2) == [] and processes_mentioning(str(run_dir)) == []
    steps = [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r]
    assert steps == sorted(set(steps)) and steps[-1] > stopped_at and stopped_at in steps  # resumed, no step twice
    assert ui.dashboard.records(str(run_dir)) == read_metrics(run_dir / "metrics.jsonl")  # the plot saw the same


def test_two_process_run_from_the_toolbar_then_stop(qtbot, open_window, project_path):
    """torchrun puts its workers in sessions of their own: Stop must still leave none."""
    w = open_window(project_path)
    ui = w.run_ui
    ui.toolbar.procs.setValue(2)
    ui.toolbar.run_action.trigger()
    active = ui.controller.active
    qtbot.waitUntil(lambda: active.job is not None, timeout=60_000)
    run_dir, pgid = active.run_dir, active.pgid
    assert "torch.distributed.run" in active.command and "--nproc-per-node=2" in active.command
    qtbot.waitUntil(lambda: loss_points(ui, run_dir) >= 2, timeout=150_000)
    workers = [p for p in [active.job.pid, *active.seen] if p in processes_mentioning(str(run_dir))]
    assert len(workers) >= 3  # torchrun and its two ranks
    ui.toolbar.stop_action.trigger()
    qtbot.waitUntil(lambda: not ui.controller.running, timeout=90_000)
    assert group_pids(pgid) == [] and processes_mentioning(str(run_dir)) == []
    assert summarize_run(run_dir).state == "cancelled"
    if (run_dir / "peak_mem_per_rank.json").exists():  # written when the ranks stop in time
        assert len(ui.dashboard._runs[str(run_dir)].peaks.points()) == 2


def two_finished_runs(project_path):
    project = load_project(project_path)
    project.training.eval_interval = 3
    dirs = []
    for seed in (0, 1):
        rd = prepare_run(project, new_run_dir(project), steps=6, seed=seed)
        run(rd)
        dirs.append(rd)
    return dirs


def test_history_restart_overlay_csv_delete_and_screenshot(qtbot, open_window, project_path, tmp_path):
    a, b = two_finished_runs(project_path)
    w1 = open_window(project_path)
    assert sorted(w1.run_ui.runs_panel.run_paths()) == sorted([str(a), str(b)])
    w1.close()

    w2 = open_window(project_path)  # a restart: a new window reads the runs folder again
    ui = w2.run_ui
    assert sorted(ui.runs_panel.run_paths()) == sorted([str(a), str(b)])
    assert ui.runs_panel.summary(str(a)).state == "succeeded"

    w2.open_run(a)  # what the screenshot command calls; waits for the confusion matrix
    assert ui.dashboard.run_keys() == [str(a)]
    assert ui.dashboard.records(str(a)) == read_metrics(a / "metrics.jsonl")
    assert ui.dashboard.confusion.matrix.shape == (10, 10)

    ui.runs_panel.select_runs([str(a), str(b)])
    assert ui.runs_panel.compare_button.isEnabled()
    ui.runs_panel.compare_button.click()
    assert sorted(ui.dashboard.run_keys()) == sorted([str(a), str(b)])
    # parsed in the dashboard's parse process, plotted by its timer
    logged = {rd: sum("loss" in r for r in read_metrics(rd / "metrics.jsonl")) for rd in (a, b)}
    qtbot.waitUntil(lambda: all(loss_points(ui, rd) == n for rd, n in logged.items()), timeout=10_000)
    ca, cb = ui.dashboard.curve(str(a), "loss"), ui.dashboard.curve(str(b), "loss")
    for run_dir, c in ((a, ca), (b, cb)):  # every recorded loss, ending at the last step
        xs = c.getOriginalDataset()[0]
        assert list(xs) == [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r] and xs[-1] == 6
    assert ca.opts["pen"].color() != cb.opts["pen"].color()

    out = ui.dashboard.export_csv(tmp_path / "a.csv", keys=[str(a)])
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    lines = [json.loads(ln) for ln in (a / "metrics.jsonl").read_text().splitlines()]
    assert [{k: (v if k in ("event", "state", "checkpoint") else json.loads(v)) for k, v in r.items() if v != "" and k != "run"}
            for r in rows] == lines

    B = QMessageBox.StandardButton
    asked = []
    w2.ask = lambda *args: asked.append(args[2]) or B.Cancel
    assert not ui.delete(b) and b.exists() and b.name in asked[0]
    w2.ask = lambda *args: B.Yes
    assert ui.delete(b) and not b.exists()
    assert ui.runs_panel.run_paths() == [str(a)] and str(b) not in ui.dashboard.run_keys()

    from app.cli import main

    png = tmp_path / "shot.png"
    assert main(["screenshot", str(project_path), "--run", str(a), "-o", str(png), "--size", "1200x800"]) == 0
    img = QImage(str(png))
    assert not img.isNull() and img.width() >= 1200 and img.height() >= 800  # docks may need a bit more


def test_a_failed_run_names_the_node(qtbot, open_window, project_path):
    w = open_window(project_path)
    ui = w.run_ui
    project = load_project(project_path)
    rd = prepare_run(project, new_run_dir(project), steps=3)
    spec = json.loads((rd / "run.json").read_text())
    for n in spec["model"]["nodes"]:
        if n["id"] == "fc2":  # the runtime will build a layer that cannot take fc1's output
            n["params"]["in_features"] = 5
    (rd / "run.json").write_text(json.dumps(spec))
    ui.controller.node_ids = tuple(project.graph.nodes)
    ui.controller.launch(rd)  # python -m engine.runtime.train RUN_DIR
    with qtbot.waitSignal(ui.controller.finished, timeout=60_000) as sig:
        pass
    assert sig.args == [str(rd), "failed"]
    box = ui.failure_box
    assert box is not None and "node 'fc2'" in box.text() and "rank 0" in box.text()
    assert "Traceback" in box.detailedText() and "fc2" in box.detailedText()
    show = [b for b in box.buttons() if b.text() == "Show 'fc2'"]
    assert show
    show[0].click()
    assert w.scene.selected_ids() == ["fc2"]
    assert ui.notifications[-1].startswith(f"Run {rd.name} failed")


def test_stop_while_the_run_is_prepared_starts_nothing_and_leaves_no_folder(qtbot, open_window, project_path):
    w = open_window(project_path)
    ui = w.run_ui
    run_dir = ui.run()
    assert ui.controller.running and ui.controller.active.job is None  # its folder is being prepared
    ui.stop()
    with qtbot.waitSignal(ui.controller.finished, timeout=60_000) as sig:
        pass
    assert sig.args == [str(run_dir), "cancelled"] and not ui.controller.running
    assert not run_dir.exists() and processes_mentioning(str(run_dir)) == []
    assert ui.toolbar.run_action.isEnabled()


def test_closing_while_a_run_is_prepared_leaves_no_folder(qtbot, open_window, project_path):
    w = open_window(project_path)
    ui = w.run_ui
    run_dir = ui.run()
    preparing = ui.controller.active.preparing
    ui.controller.shutdown(timeout_s=0)  # the app closes at once; the worker is still writing the folder
    assert not ui.controller.running
    preparing.result(timeout=60)
    qtbot.waitUntil(lambda: not run_dir.exists(), timeout=10_000)  # removed once the worker was done with it
    assert processes_mentioning(str(run_dir)) == []


def test_a_project_the_cli_refuses_leaves_no_folder_and_says_why(qtbot, open_window, project_path):
    w = open_window(project_path)
    ui = w.run_ui
    w.controller.set_param("x", "shape", [63])  # the digits have 64 features; an unsaved edit
    assert w.is_dirty()
    run_dir = ui.run()
    with qtbot.waitSignal(ui.controller.finished, timeout=60_000) as sig:
        pass
    assert sig.args == [str(run_dir), "failed"]
    assert "node 'x' (Input): shape is [63]" in ui.failure_box.text()
    assert not run_dir.exists()  # nothing half-made left in the runs folder
    assert [p.name for p in project_path.parent.iterdir() if p.suffix == ".lflow"] == ["mlp.lflow"]  # snapshot gone
    assert load_project(project_path).graph.nodes["x"].params["shape"] == [64]  # the file itself untouched
