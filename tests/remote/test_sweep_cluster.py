"""A sweep on a cluster: one job per run on the real loopback sshd (remote/sweep_queue.py's
_ClusterHandle over remote/launch/__init__.py and remote/tracker.py), its runs table read from the
mirrored metrics, and a run stopped early by a rule cancelled on the node with nothing left."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

import layerflow as lf
from app.cli import main
from engine.runs.history import row_value
from remote.jobs import JobDB

from sshd_helpers import REMOTE_PYTHON, USER, free_port

EXAMPLES = Path(__file__).resolve().parents[2] / "resources" / "examples"


@pytest.mark.slow
@pytest.mark.xdist_group("remote-deploy")
def test_a_sweep_runs_one_job_per_point_on_a_cluster(sshd_pair, config_dir, tmp_path):
    s = sshd_pair.servers[0]
    assert main(["cluster", "add", "lab", "--host", f"{USER}@{s.addr}:{s.port}", "--identity",
                 str(sshd_pair.client_key), "--workdir", str(tmp_path / "work"), "--python", REMOTE_PYTHON,
                 "--known-hosts", str(sshd_pair.known_hosts), "--env", "OMP_NUM_THREADS=1",
                 "--rdzv-port", str(free_port("127.0.0.2"))]) == 0
    shutil.copy(EXAMPLES / "mlp_digits.lflow", tmp_path / "mlp.lflow")
    p = lf.Project.load(tmp_path / "mlp.lflow")
    p.training.log_interval = 5
    # the second lr breaks the rule at step 10 and is cancelled on the node; the first ends
    sweep = {"name": "lab-lrs", "parameters": {"training.optimizer.lr": [0.001, 0.005]}, "steps": 3000,
             "stop": {"rules": [{"metric": "lr", "above": 0.002, "at_step": 10}]}}
    events = []
    rows = p.sweep(sweep, cluster="lab", on_event=lambda kind, run: events.append((kind, run.index, run.state)))
    assert [row_value(r, "lr") for r in rows] == [0.001, 0.005], rows
    done, stopped = rows
    # the runs table reads the mirrored metrics and status copied into each local run folder
    assert done["state"] == "succeeded" and done["step"] == 3000, done
    assert done["final_loss"] is not None and done["best_loss"] <= done["final_loss"]
    assert done["samples_per_s"] and done["cpu_pct_mean"] is not None  # throughput; the node's system samples
    assert stopped["state"].startswith("stopped early: lr above 0.002 at step 10") and 10 <= stopped["step"] < 3000, stopped
    assert stopped["final_loss"] is not None
    assert [e for e in events if e[0] == "started"] == [("started", 0, "running"), ("started", 1, "running")]
    # one job per run, each followed to its end; nothing of the stopped one runs on the node
    jobs = [j for j in JobDB().list() if j.name.startswith("lab-lrs")]
    assert sorted(j.state for j in jobs) == ["cancelled", "succeeded"], [(j.name, j.state) for j in jobs]
    for j in jobs:
        left = subprocess.run(["pgrep", "-f", j.nodes[0].jobdir], capture_output=True, text=True).stdout
        assert not left, f"job {j.name} left processes: {left}"
    state = json.loads(next((tmp_path / "runs").glob("sweep-lab-lrs-*.json")).read_text())
    assert state["cluster"] == "lab" and [r["state"] for r in state["runs"]] == ["succeeded", "stopped"]
