"""A run from the main window's toolbar: each rank's system samples reach the
dashboard's System tab while it trains, and, with MLFLOW_TRACKING_URI set, the run is
copied to MLflow as it goes (read back from the sqlite store once it is stopped)."""
from pathlib import Path

import pytest

from app.settings import Settings
from app.window import MainWindow
from engine.project import load_project, save_project
from engine.runs.tail import read_metrics

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "resources" / "examples"
pytestmark = [pytest.mark.gui, pytest.mark.slow, pytest.mark.xdist_group("run_ui")]


def test_live_system_tab_and_mlflow(qtbot, tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    pytest.importorskip("sqlalchemy", reason="MLflow's sqlite store needs sqlalchemy (the mlflow extra)")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("LAYERFLOW_SYSTEM_PERIOD", "0.2")  # (the run's processes inherit it)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    p = load_project(EX / "mlp_digits.lflow")
    p.training.steps = 100_000
    path = tmp_path / "proj" / "mlp.lflow"
    path.parent.mkdir()
    save_project(p, path)
    w = MainWindow(load_project(path), settings=Settings(tmp_path / "home"), recover=False)
    qtbot.addWidget(w)
    w.resize(1400, 900)
    w.show()
    ui = w.run_ui
    try:
        ui.toolbar.run_action.trigger()
        active = ui.controller.active
        run_dir = str(active.run_dir)
        dash = ui.dashboard
        qtbot.waitUntil(lambda: run_dir in dash.run_keys() and "cpu_pct_rank0" in dash._runs[run_dir].series
                        and dash._runs[run_dir].series["cpu_pct_rank0"].y.n >= 2, timeout=120_000)
        dash.show_system()
        dash.flush()
        x, y = dash.series_data(run_dir, "rss_mb_rank0")
        assert len(x) >= 2 and (y > 20).all()
        assert ui.mlflow is not None and ui.mlflow.error is None
        ui.stop()
        qtbot.waitUntil(lambda: not ui.controller.running, timeout=60_000)
    finally:
        ui.shutdown()
    ui._mlflow_last.wait(60)
    ui._mlflow_last.stop()
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    run_id = ui._mlflow_last.sync.run_id
    want = sorted((r["step"], r["loss"]) for r in read_metrics(Path(run_dir) / "metrics.jsonl") if "loss" in r)
    assert sorted((m.step, m.value) for m in client.get_metric_history(run_id, "loss")) == want
    assert client.get_run(run_id).info.status == "KILLED"  # stopped by the user
    assert client.get_metric_history(run_id, "system/cpu_pct_rank0")
