"""Per-rank numbers of a real 2-process run (torchrun, gloo): each rank's step time,
throughput and replica loss in the dashboard, and each rank's log in the log viewer."""
import json
from pathlib import Path

import pytest

from app.cli import main
from app.window import MainWindow
from app.settings import Settings
from engine.project import load_project, save_project

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gui, pytest.mark.slow]


def test_a_two_rank_run_shows_each_ranks_step_time_loss_and_log(qtbot, tmp_path):
    p = load_project(ROOT / "resources" / "examples" / "mlp_digits.lflow")
    p.training.steps, p.training.eval_interval = 20, 10
    path = save_project(p, tmp_path / "mlp.lflow")
    run_dir = tmp_path / "runs" / "two"
    assert main(["train", str(path), "--nproc", "2", "--out", str(run_dir)]) == 0
    for r in (0, 1):
        lines = [json.loads(x) for x in (run_dir / "logs" / f"rank{r}.metrics.jsonl").read_text().splitlines()]
        steps = [x["step"] for x in lines]  # at the run's log steps (the first ones each, then every few)
        assert steps[:3] == [1, 2, 3] and steps == sorted(set(steps)) and steps[-1] == 20
        assert all(x["rank"] == r for x in lines)
        assert all(x["step_ms"] > 0 and "loss" in x for x in lines)  # dp replicas: each has its own loss
    mean = [json.loads(x)["loss"] for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    r0 = [json.loads(x)["loss"] for x in (run_dir / "logs" / "rank0.metrics.jsonl").read_text().splitlines()]
    r1 = [json.loads(x)["loss"] for x in (run_dir / "logs" / "rank1.metrics.jsonl").read_text().splitlines()]
    assert mean == pytest.approx([(a + b) / 2 for a, b in zip(r0, r1)], rel=1e-6)  # the replicas' mean

    w = MainWindow(load_project(path), settings=Settings(tmp_path / "home"), recover=False)
    qtbot.addWidget(w)
    w.resize(1400, 900)
    w.show()
    w.run_ui.open_run(run_dir)
    dash = w.run_ui.dashboard
    dash.wait_parsed()  # its metrics.jsonl parsed in the parse process; the ranks' records queued behind it
    dash.flush()
    key = str(run_dir)
    for r in (0, 1):
        x, y = dash.series_data(key, f"step_ms_rank{r}")
        logged = [json.loads(s)["step"] for s in (run_dir / "logs" / f"rank{r}.metrics.jsonl").read_text().splitlines()]
        assert list(x) == logged and (y > 0).all()
        x, y = dash.series_data(key, f"loss_rank{r}")
        assert len(x) == len(logged)
    assert dash.curve(key, "step_ms_rank1") is not None

    viewer = w.run_ui.show_logs(run_dir)
    names = [viewer.files.itemText(i) for i in range(viewer.files.count())]
    assert names[:2] == ["rank0.log", "rank1.log"] and "launcher.log" in names
    viewer.show_file("rank1.log")
    assert viewer.text.toPlainText() == (run_dir / "logs" / "rank1.log").read_text().rstrip("\n")
    with open(run_dir / "logs" / "rank1.log", "a") as f:  # a log that grows is followed
        f.write("one more line\n")
    viewer.poll()
    assert viewer.text.toPlainText().endswith("one more line")
    w.run_ui.shutdown()



def test_the_bottom_area_gets_its_height_back_when_the_user_leaves_the_dashboard(qtbot, tmp_path):
    w = MainWindow(load_project(ROOT / "resources" / "examples" / "mlp_digits.lflow"),
                   settings=Settings(tmp_path / "home"), recover=False)
    qtbot.addWidget(w)
    w.resize(1400, 900)
    w.show()
    qtbot.wait(20)
    w.run_ui.show_dashboard()
    qtbot.wait(20)
    tall = w.run_ui.dashboard_dock.height()
    assert tall >= 0.5 * w.height()
    w.problems_dock.raise_()  # the user clicks the Problems tab
    qtbot.waitUntil(lambda: w.problems_dock.height() < tall - 100, timeout=2000)
    w.run_ui.shutdown()
