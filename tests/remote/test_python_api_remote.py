"""`Project.deploy` and `lf.Job` on the real loopback sshd: a job followed from a script to
its end, attached again by id, fetched; and one cancelled with nothing left behind."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import layerflow as lf
from app.cli import main

from sshd_helpers import REMOTE_PYTHON, USER, free_port

EXAMPLES = Path(__file__).resolve().parents[2] / "resources" / "examples"


def _cluster(env, name: str, tmp_path: Path) -> None:
    s = env.servers[0]
    assert main(["cluster", "add", name, "--host", f"{USER}@{s.addr}:{s.port}", "--identity", str(env.client_key),
                 "--workdir", str(tmp_path / "work"), "--python", REMOTE_PYTHON, "--known-hosts",
                 str(env.known_hosts), "--env", "OMP_NUM_THREADS=1", "--rdzv-port", str(free_port("127.0.0.2"))]) == 0


@pytest.mark.slow
@pytest.mark.xdist_group("remote-deploy")
def test_deploy_follow_attach_fetch_and_cancel(sshd_pair, config_dir, tmp_path):
    _cluster(sshd_pair, "lab", tmp_path)
    shutil.copy(EXAMPLES / "mlp_digits.lflow", tmp_path / "mlp.lflow")
    p = lf.Project.load(tmp_path / "mlp.lflow")
    with pytest.raises(lf.LayerflowError, match="no cluster named 'nowhere'"):
        p.deploy("nowhere")
    p.training.log_interval = 5
    job = p.deploy("lab", steps=20, out=tmp_path / "rd")
    steps = [r["step"] for r in job.metrics(follow=True, poll_s=0.5, timeout=300) if "loss" in r]
    assert steps == [5, 10, 15, 20]  # every logged step once, in order, to the end
    st = job.status()
    assert st.state == "succeeded" and st.step == 20 and st.ok
    again = lf.Job(job.id[:-2])  # attached again, by a unique prefix of its id
    assert again.id == job.id and again.status().state == "succeeded"
    assert "step 20/20" in again.logs()
    got = again.fetch(tmp_path / "got")
    assert (got / "model.pt").is_file()
    assert json.loads((got / "metrics.jsonl").read_text().splitlines()[-1])["event"] == "end"
    job.close()
    again.close()

    p.training.log_interval = 1
    long = p.deploy("lab", steps=1_000_000, out=tmp_path / "rd_long")
    first = next(r for r in long.metrics(follow=True, poll_s=0.5, timeout=300) if "loss" in r)
    assert first["step"] >= 1
    st = long.cancel()
    assert st.state == "cancelled"
    assert long.wait(timeout=60).state == "cancelled"  # a cancelled job is no failure
    long.close()
    with pytest.raises(lf.LayerflowError, match="no job"):
        lf.Job("no-such-job")

