"""The remote commands of `python main.py`, run in-process against the real sshd pair."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.cli import main

from sshd_helpers import REMOTE_PYTHON, USER, free_port

EXAMPLES = Path(__file__).resolve().parents[2] / "resources" / "examples"


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def add_args(env, name, tmp_path, n=2, known_hosts=None):
    args = ["cluster", "add", name]
    for s in env.servers[:n]:
        args += ["--host", f"{USER}@{s.addr}:{s.port}"]
    return args + ["--identity", env.client_key, "--workdir", tmp_path / "work", "--python", REMOTE_PYTHON,
                   "--known-hosts", known_hosts or env.known_hosts, "--env", "OMP_NUM_THREADS=1",
                   "--rdzv-port", free_port("127.0.0.2")]


def test_cluster_commands(sshd_pair, config_dir, tmp_path, capsys):
    code, out, _ = run(capsys, *add_args(sshd_pair, "lab", tmp_path))
    assert code == 0 and "2 node(s) saved" in out
    code, out, _ = run(capsys, "cluster", "list")
    assert code == 0 and "lab" in out and "127.0.0.3" in out
    code, out, err = run(capsys, *add_args(sshd_pair, "data", tmp_path), "--data-path", f"{tmp_path}/d=/scratch/d",
                         "--data-path", "~/corpus=~/corpus")
    assert code == 0, err
    from remote.cluster import ClusterStore
    assert ClusterStore().get("data").data_paths == {f"{tmp_path}/d": "/scratch/d",
                                                     str(Path.home() / "corpus"): "~/corpus"}
    code, _, err = run(capsys, *add_args(sshd_pair, "bad", tmp_path), "--data-path", "/here")
    assert code == 2 and "--data-path '/here': expected FOLDER_HERE=FOLDER_THERE" in err
    code, _, err = run(capsys, *add_args(sshd_pair, "bad", tmp_path), "--data-path", "/here=relative/there")
    assert code == 2 and "relative/there" in err and "absolute" in err
    run(capsys, "cluster", "remove", "data")
    code, _, err = run(capsys, *add_args(sshd_pair, "hpc", tmp_path, n=1), "--backend", "slurm", "--preempt-grace", "120")
    assert code == 0, err
    assert ClusterStore().get("hpc").preempt_grace_s == 120  # Slurm's warning before a preemption (sbatch --signal)
    assert ClusterStore().get("lab").preempt_grace_s == 60  # the default
    code, _, err = run(capsys, *add_args(sshd_pair, "bad", tmp_path, n=1), "--backend", "slurm", "--preempt-grace", "-5")
    assert code == 2 and "preempt_grace_s" in err
    run(capsys, "cluster", "remove", "hpc")
    code, out, _ = run(capsys, "cluster", "check", "lab")
    assert code == 0 and "127.0.0.2" in out and "NO" not in out
    code, _, err = run(capsys, "cluster", "add", "bad", "--host", "root@h:99999")
    assert code == 2 and "port" in err
    code, _, err = run(capsys, "cluster", "remove", "nope")
    assert code == 2 and "no cluster named 'nope'" in err
    code, _, _ = run(capsys, "cluster", "remove", "lab")
    assert code == 0 and "no clusters" in run(capsys, "cluster", "list")[1]


def test_check_shows_unknown_fingerprint_then_accepts_it(sshd_pair, config_dir, tmp_path, capsys):
    kh = tmp_path / "empty_known_hosts"
    run(capsys, *add_args(sshd_pair, "new", tmp_path, n=1, known_hosts=kh))
    code, out, err = run(capsys, "cluster", "check", "new")
    assert code == 1 and "unknown host key" in err
    fp = err.split("--accept-host-key ")[1].split()[0]
    assert fp.startswith("SHA256:") and not kh.exists()
    code, out, _ = run(capsys, "cluster", "check", "new", "--json")
    assert json.loads(out)["hosts"][0]["unknown_key"] == fp  # what the GUI shows in its dialog
    code, out, err = run(capsys, "cluster", "check", "new", "--accept-host-key", fp)
    assert code == 0, err
    assert kh.read_text().startswith(f"[127.0.0.2]:{sshd_pair.servers[0].port} ssh-ed25519 ")


def test_import_ssh_config(sshd_pair, config_dir, tmp_path, capsys):
    cfg = tmp_path / "ssh_config"
    lines = []
    for i, s in enumerate(sshd_pair.servers):
        lines += [f"Host node{i}", f"  HostName {s.addr}", f"  Port {s.port}", "  User root",
                  f"  IdentityFile {sshd_pair.client_key}"]
    cfg.write_text("\n".join(lines) + "\n")
    code, out, err = run(capsys, "cluster", "import-ssh-config", "imp", "node0", "node1", "--config", cfg,
                         "--python", REMOTE_PYTHON, "--known-hosts", sshd_pair.known_hosts)
    assert code == 0, err
    code, out, _ = run(capsys, "cluster", "list", "--json")
    (c,) = json.loads(out)
    assert [h["address"] for h in c["hosts"]] == ["127.0.0.2", "127.0.0.3"]
    assert run(capsys, "cluster", "check", "imp")[0] == 0
    code, _, err = run(capsys, "cluster", "import-ssh-config", "x", "ghost", "--config", cfg)
    assert code == 2 and "ghost" in err


@pytest.mark.slow
@pytest.mark.xdist_group("remote-deploy")
def test_deploy_jobs_status_logs_fetch(sshd_pair, config_dir, tmp_path, capsys):
    run(capsys, *add_args(sshd_pair, "one", tmp_path, n=1))
    proj = tmp_path / "proj" / "mlp.lflow"
    proj.parent.mkdir()
    shutil.copy(EXAMPLES / "mlp_digits.lflow", proj)
    code, _, err = run(capsys, "deploy", proj, "--cluster", "one", "--steps", "20", "--out", tmp_path / "rd0",
                       "--remote-data", tmp_path / "nowhere.npz")
    assert code == 2 and "nowhere.npz is not readable" in err
    # the data set already "on the cluster": the bundle leaves it out, the node links to it
    from engine.project import load_project
    from engine.runs.build import prepare_run
    shutil.copy(prepare_run(load_project(proj), tmp_path / "src", steps=1) / "data.npz", tmp_path / "big data.npz")
    code, out, err = run(capsys, "deploy", proj, "--cluster", "one", "--steps", "20", "--out", tmp_path / "rd",
                         "--remote-data", tmp_path / "big data.npz")
    assert code == 0, err
    job_id = out.strip()
    assert "upload" in err and "rendezvous" in err  # progress bar and the preflight table
    assert "of bundle and 0 B of data (read at" in err  # what went over the wire
    code, out, _ = run(capsys, "logs", job_id[:-2], "-f")  # a unique prefix names the job
    assert code == 0 and "step 20/20" in out
    code, out, _ = run(capsys, "status", job_id, "--json")
    st = json.loads(out)
    assert st["state"] == "succeeded" and st["step"] == 20
    code, out, _ = run(capsys, "jobs")
    assert job_id in out and "succeeded" in out and "20/20" in out
    from remote.jobs import JobDB
    jobdir = Path(JobDB().get(job_id).nodes[0].jobdir)
    assert (jobdir / "run" / "data.npz").resolve() == (tmp_path / "big data.npz").resolve()
    code, out, _ = run(capsys, "fetch", job_id, "-o", tmp_path / "got")
    assert code == 0 and (tmp_path / "got" / "model.pt").is_file()
    metrics = (tmp_path / "got" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(metrics[-1])["event"] == "end"
    code, _, err = run(capsys, "status", "no-such-job")
    assert code == 2 and "no job" in err


def test_deploy_sets_this_jobs_node_bounds_and_restarts(sshd_pair, config_dir, tmp_path, capsys):
    """deploy --min-nodes/--max-nodes/--max-restarts: this job's, over the profile's, checked
    as a profile is (nothing prepared or launched on a bad pair); the node script's torchrun
    gets them."""
    from remote.cluster import ClusterStore
    from remote.jobs import Job
    from remote.launch.ssh_torchrun import _torchrun, node_bounds

    run(capsys, *add_args(sshd_pair, "two", tmp_path))
    proj = tmp_path / "proj" / "mlp.lflow"
    proj.parent.mkdir()
    shutil.copy(EXAMPLES / "mlp_digits.lflow", proj)
    code, _, err = run(capsys, "deploy", proj, "--cluster", "two", "--min-nodes", "3", "--max-nodes", "2",
                       "--out", tmp_path / "rd")
    assert code == 2 and "min_nodes (3) is above max_nodes (2)" in err and "deploy to 'two'" in err
    assert not (tmp_path / "rd").exists()
    profile = ClusterStore().get("two")
    assert node_bounds(profile, 2, 1, 1) == (1, 2)  # elastic by default: down to one node
    c = profile.with_settings("t", min_nodes=2, max_restarts=0)
    assert (c.min_nodes, c.max_restarts, ClusterStore().get("two").min_nodes) == (2, 0, None)
    lo, hi = node_bounds(c, 2, 1, 1)
    job = Job(id="j", name="j", cluster=c.model_dump(mode="json"), created=0.0, token="t" * 24)
    job.extra = {"nodes_bounds": [lo, hi]}
    line = _torchrun(job, c, 0, 2, 1)
    assert "--nnodes=2 " in line and "--max-restarts=0" in line  # every node needed: not elastic
    assert "--nnodes=1:2" in _torchrun(Job(**{**job.__dict__, "extra": {"nodes_bounds": [1, 2]}}), profile, 0, 2, 1)
