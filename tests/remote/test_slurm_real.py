"""Layerflow jobs under a real Slurm: munged + slurmctld + two slurmd, each slurmd in a
network namespace of its own (slurm_helpers.py), reached through a real sshd login
node. deploy -> track (through a cut link and an app restart) -> fetch; cancel; the
time limit; the errors a user meets on real clusters."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.project import load_project, save_project
from remote.cluster import ClusterStore, parse_cluster
from remote.jobs import JobDB
from remote.tracker import Tracker

from test_remote_deploy import wait_for

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "resources" / "examples" / "mlp_digits.lflow"
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]


def cli(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, str(ROOT / "main.py"), *args], capture_output=True, text=True,
                       timeout=timeout, cwd=ROOT)
    if check and r.returncode != 0:
        raise AssertionError(f"main.py {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r


def project(tmp_path: Path, *, dp: int, steps: int, checkpoint_interval: int = 20, name: str = "digits",
            log_interval: int = 1) -> Path:
    p = load_project(EXAMPLE)
    p.placement.dp = dp
    p.training.log_interval = log_interval  # 1: a line per step, and every one must arrive once
    p.training.checkpoint_interval = checkpoint_interval
    p.training.eval_interval = max(10, steps // 2)
    p.training.steps = steps
    path = tmp_path / f"{name}.lflow"
    save_project(p, path)
    return path


def add_profile(slurm_env, tmp_path: Path, name: str = "hpc", **kw):
    c = parse_cluster(slurm_env.profile(name, tmp_path / "shared work", **kw))
    ClusterStore().save(c)
    return c


def job_processes(token: str) -> list[int]:
    """Processes anywhere on this machine (every node's namespace) carrying the job's token."""
    from remote.jobctl import job_pids

    return job_pids(token, None)


def losses(path: Path) -> dict[int, float]:
    out = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if "loss" in r and isinstance(r.get("step"), int):
            assert r["step"] not in out, f"step {r['step']} twice"
            out[r["step"]] = r["loss"]
    return out


def test_two_node_job_deploy_to_fetch_equals_local_run(slurm_env, tmp_path, config_dir, relay_factory):
    """The digits example, dp=2 as 2 nodes x 1 process (2 tasks on one node where no
    namespaces can be made). Deployed with the CLI; followed through a cut link and an app
    restart (nothing lost, nothing twice); fetched; its losses equal a local
    `train --nproc 2` of the same project."""
    steps = 40
    proj = project(tmp_path, dp=2, steps=steps)
    login = slurm_env.login
    relay = relay_factory((login.addr, login.port))
    kh = tmp_path / "kh"
    kh.write_text(login.public_key_line().replace(f"[{login.addr}]:{login.port}", f"[127.0.0.1]:{relay.port}")
                  + "\n")
    c = add_profile(slurm_env, tmp_path, known_hosts=str(kh))
    data = c.model_dump(mode="json")
    data["hosts"][0].update(address="127.0.0.1", port=relay.port)
    ClusterStore().save(parse_cluster(data))

    r = cli("deploy", str(proj), "--cluster", "hpc", "--out", str(tmp_path / "prepared"))
    job_id = r.stdout.strip().splitlines()[-1]
    assert "slurm partition debug (UP)" in r.stderr  # the preflight table, with what Slurm said
    job = JobDB().get(job_id)
    assert job.backend == "slurm" and job.extra["slurm_id"].isdigit() and job.extra["nnodes"] == (
        2 if slurm_env.cluster.multi_node else 1)
    sid = job.extra["slurm_id"]

    seen: list[dict] = []
    tr = Tracker(job_id, on_metrics=seen.extend, lost_after=600)
    wait_for(lambda: tr.poll() and any("loss" in r for r in seen), what="the first loss")
    relay.stop()  # --- cut the link to the login node
    assert not tr.poll() or not tr.nodes[0].reachable
    assert tr.job.state in ("running", "succeeded") or tr.job.state == "pending"
    n_cut = len(seen)
    time.sleep(1.0)
    relay.start()  # --- back: the same tracker goes on from its offsets
    wait_for(lambda: tr.poll() and (len(seen) > n_cut or tr.job.done), what="metrics after the cut")
    tr.close()  # --- the app quits; a new one reattaches from the job database
    with Tracker(job_id, on_metrics=seen.extend) as tr2:
        job = tr2.follow(interval=0.3)
    assert job.state == "succeeded", job.error
    steps_seen = [r["step"] for r in seen if "loss" in r]
    assert steps_seen == list(range(1, steps + 1))  # none lost, none twice
    if slurm_env.cluster.multi_node:  # srun put one torchrun on each node
        logs = JobDB().mirror_dir(job_id) / "logs"
        assert "node 0 of 2" in (logs / "node0.out").read_text() and "node 1 of 2" in (logs / "node1.out").read_text()

    st = cli("status", job_id)
    assert f"{job_id}: succeeded, step {steps}/{steps}" in st.stdout
    assert f"slurm: job {sid} COMPLETED" in st.stdout
    assert "Slurm " + sid in cli("jobs", "--no-refresh").stdout

    out = tmp_path / "fetched"
    cli("fetch", job_id, "-o", str(out))
    for f in ("model.pt", "metrics.jsonl", "status.json", "run.json", "checkpoints/latest", "logs/rank0.log",
              "logs/rank1.log", f"logs/slurm-{sid}.out"):
        assert (out / f).exists(), f
    remote = losses(out / "metrics.jsonl")
    assert sorted(remote) == list(range(1, steps + 1))

    local = tmp_path / "local"
    cli("train", str(proj), "--nproc", "2", "--out", str(local))
    mine = losses(local / "metrics.jsonl")
    assert sorted(mine) == sorted(remote)
    for s in remote:
        assert remote[s] == pytest.approx(mine[s], rel=1e-5, abs=1e-6), s
    assert job_processes(job.token) == [] and sid not in slurm_env.cluster.jobs()


def test_cancel_ends_every_step_and_leaves_no_process(slurm_env, tmp_path, config_dir):
    proj = project(tmp_path, dp=2, steps=100000, checkpoint_interval=100000)
    add_profile(slurm_env, tmp_path)
    job_id = cli("deploy", str(proj), "--cluster", "hpc").stdout.strip().splitlines()[-1]
    with Tracker(job_id) as tr:
        wait_for(lambda: tr.poll().state == "running" and (tr.job.step or 0) >= 3, what="the job runs")
    token, sid = tr.job.token, tr.job.extra["slurm_id"]
    assert job_processes(token)  # torchrun and its workers, inside the nodes' namespaces
    r = cli("cancel", job_id)
    assert f"{job_id}: cancelled" in r.stdout
    assert sid not in slurm_env.cluster.jobs() and not [s for s in slurm_env.cluster.steps() if s.startswith(sid)]
    assert job_processes(token) == []
    job = JobDB().get(job_id)
    assert job.state == "cancelled"
    # SIGTERM from Slurm reached the run: it stopped at a step boundary and checkpointed there
    run = Path(job.nodes[0].jobdir) / "run"
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "cancelled" and (run / "checkpoints" / "latest").exists()


def test_time_limit_shows_as_timeout_and_the_fetched_run_resumes(slurm_env, tmp_path, config_dir):
    """Slurm stops the job at its time limit (1 minute, its smallest); the job shows as
    timed out, with its last checkpoint; `train --resume` on the fetched run goes on."""
    proj = project(tmp_path, dp=1, steps=10 ** 7, checkpoint_interval=200, log_interval=50)
    add_profile(slurm_env, tmp_path, time_limit="1", nproc_per_node=1)
    job_id = cli("deploy", str(proj), "--cluster", "hpc", "--steps", "1000000").stdout.strip().splitlines()[-1]
    with Tracker(job_id) as tr:
        job = tr.follow(interval=1.0)
    assert job.state == "timeout", (job.state, job.error)
    assert "time limit" in job.error and "train --resume" in job.error
    assert "timeout" in cli("status", job_id).stdout
    out = tmp_path / "fetched"
    cli("fetch", job_id, "-o", str(out))
    ckpt = (out / "checkpoints" / "latest").read_text().strip()
    last = max(losses(out / "metrics.jsonl"))
    assert ckpt and last >= 200
    go_on = last + 20
    cli("train", "--resume", str(out), "--steps", str(go_on))
    after = losses(out / "metrics.jsonl")
    assert max(after) == go_on and json.loads((out / "status.json").read_text())["state"] == "succeeded"


def test_errors_name_the_setting_and_submit_nothing(slurm_env, tmp_path, config_dir):
    proj = project(tmp_path, dp=2, steps=5)

    def deploy_fails(**kw) -> str:
        add_profile(slurm_env, tmp_path, name="bad", **kw)
        r = cli("deploy", str(proj), "--cluster", "bad", check=False)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "Traceback" not in r.stderr
        return r.stderr

    before = slurm_env.cluster.jobs()
    err = deploy_fails(partition="gpux")
    assert "partition 'gpux' does not exist on cluster 'bad' (partitions: debug, capped)" in err
    err = deploy_fails(gpus_per_node=1, nproc_per_node=1)
    assert "gpus_per_node 1 is more than a node of partition 'debug' has: no GPUs" in err
    err = deploy_fails(python="/nowhere/bin/python3")
    assert "python '/nowhere/bin/python3' does not run" in err
    err = deploy_fails(time_limit="45")
    assert "time_limit 45 is longer than partition 'debug' allows (MaxTime 00:30:00)" in err
    if slurm_env.cluster.multi_node:
        # the preflight passes (the partition has 2 nodes up); sbatch refuses: its MaxNodes is 1
        # and the cluster enforces partition limits at submission (EnforcePartLimits=ALL)
        err = deploy_fails(partition="capped")
        assert ("sbatch refused the job: sbatch: error: Batch job submission failed: Node count specification "
                "invalid (check the profile's nproc_per_node / placement)") in err
        assert JobDB().list()[-1].state == "failed"
    assert slurm_env.cluster.jobs() == before


def test_a_full_queue_shows_pending_with_slurm_reason_in_cli_and_panel(slurm_env, tmp_path, config_dir, qtbot):
    """Another user's job holds every node: ours waits in the queue, and the CLI and the
    Remote jobs panel say why (Slurm's reason) and show its Slurm id."""
    from app.jobs_panel import JobsController, JobsPanel

    nodes = str(len(slurm_env.cluster.node_names))
    blocker = slurm_env.cluster.run("sbatch", "--parsable", "-N", nodes, "--exclusive", "-p", "debug", "-o", "/dev/null",
                                    "--wrap", "sleep 600").stdout.strip()
    try:
        wait_for(lambda: slurm_env.cluster.run("squeue", "-h", "-j", blocker, "-o", "%T").stdout.strip() == "RUNNING",
                 what="the blocking job runs")
        proj = project(tmp_path, dp=2, steps=5)
        add_profile(slurm_env, tmp_path)
        job_id = cli("deploy", str(proj), "--cluster", "hpc").stdout.strip().splitlines()[-1]
        sid = JobDB().get(job_id).extra["slurm_id"]
        with Tracker(job_id) as tr:
            job = wait_for(lambda: (j := tr.poll()).extra.get("slurm", {}).get("reason") not in (None, "None") and j,
                           what="Slurm gives a reason")
        assert job.state == "pending" and job.error == "waiting in the queue: Resources"
        st = cli("status", job_id).stdout
        assert f"{job_id}: pending" in st and f"slurm: job {sid} PENDING (Resources)" in st
        assert "error: waiting in the queue: Resources" in st

        controller = JobsController()
        panel = JobsPanel(controller)
        qtbot.addWidget(panel)
        panel.refresh()
        row = panel.job_ids().index(job_id)
        assert panel.table.item(row, 3).text() == f"pending (Resources), Slurm {sid}"
        panel.select_job(job_id)
        assert panel.buttons["Cancel"].isEnabled()

        r = cli("cancel", job_id)  # a pending job: scancel, nothing ever ran
        assert f"{job_id}: cancelled" in r.stdout and sid not in slurm_env.cluster.jobs()
    finally:
        slurm_env.cluster.run("scancel", blocker, check=False)


def test_clusters_dialog_keeps_slurm_settings_and_tests_the_partition(slurm_env, tmp_path, config_dir, qtbot):
    from app.cluster_dialog import ClusterDialog

    add_profile(slurm_env, tmp_path, time_limit="00:20:00")
    dlg = ClusterDialog()
    qtbot.addWidget(dlg)
    assert dlg.backend.currentText() == "slurm" and dlg.partition.isEnabled()
    assert (dlg.partition.text(), dlg.time_limit.text(), dlg.gpus.value()) == ("debug", "00:20:00", 0)
    dlg.test_connection()  # the login node, then Slurm itself
    qtbot.waitUntil(lambda: not dlg.busy and "partition debug" in dlg.report.toPlainText(), timeout=60000)
    n = len(slurm_env.cluster.node_names)
    assert f"slurm partition debug (UP): {n} of {n} node(s) up" in dlg.report.toPlainText()
    assert "all hosts ready" in dlg.report.toPlainText()
    dlg.partition.setText("nope")
    dlg.test_connection()
    qtbot.waitUntil(lambda: not dlg.busy and "does not exist" in dlg.report.toPlainText(), timeout=60000)
    dlg.partition.setText("capped")
    dlg.gpus.setValue(2)
    assert dlg.save()
    c = ClusterStore().get("hpc")
    assert (c.backend, c.partition, c.time_limit, c.gpus_per_node) == ("slurm", "capped", "00:20:00", 2)
    dlg.backend.setCurrentText("ssh")  # an SSH profile has no Slurm settings
    assert not dlg.partition.isEnabled() and dlg.save() and ClusterStore().get("hpc").partition is None


def test_a_run_that_fails_under_slurm_shows_failed_with_its_reason(slurm_env, tmp_path, config_dir):
    """The data set named by --remote-data is there but is no data set: the run fails on the
    node, Slurm says FAILED, and the job's error carries the run's own reason."""
    not_data = tmp_path / "not-a-dataset.npz"
    not_data.write_text("these are not arrays\n")
    proj = project(tmp_path, dp=1, steps=5)
    add_profile(slurm_env, tmp_path, nproc_per_node=1)
    job_id = cli("deploy", str(proj), "--cluster", "hpc", "--remote-data", str(not_data)).stdout.strip().splitlines()[-1]
    with Tracker(job_id) as tr:
        job = tr.follow(interval=0.5)
    assert job.state == "failed", (job.state, job.error)
    assert job.error.startswith("Slurm: FAILED (NonZeroExitCode), exit code 1:0: ValueError"), job.error
    assert cli("status", job_id).stdout.startswith(f"{job_id}: failed")


def test_a_token_file_goes_up_once_to_the_login_node_and_slurm_trains_on_it(slurm_env, tmp_path, config_dir):
    """Data here, under Slurm: uploaded once into the cache on the login node (whose file
    system the compute nodes share), the job trains on it; a second deploy sends no data."""
    from remote.launch import deploy
    from remote.launch.ssh_torchrun import prepare
    from test_remote_data import make_tokens, token_project

    toks = make_tokens(tmp_path / "tokens", n=3000)
    size = sum(f.stat().st_size for f in toks.iterdir())
    cluster = add_profile(slurm_env, tmp_path, nproc_per_node=1)
    project = token_project(toks, steps=20)
    jobs = [deploy(cluster, prepare(project, tmp_path / f"run{i}", steps=20)) for i in range(2)]
    assert [j.extra["sent"]["data"] for j in jobs] == [size, 0]
    for job in jobs:
        with Tracker(job.id) as tr:
            job = tr.follow(interval=0.5)
        assert job.state == "succeeded", job.error
        assert len(losses(Path(job.nodes[0].jobdir) / "run" / "metrics.jsonl")) == 20


def test_a_sweep_submits_one_slurm_job_per_run_and_scancels_the_one_a_rule_stops(slurm_env, tmp_path, config_dir):
    """A sweep on a Slurm cluster (remote/sweep_queue.py over deploy and the tracker): one
    sbatch job per point, both followed to their ends; the point whose lr breaks the rule
    is cancelled through Slurm (no job, no step, no process left), the other succeeds and
    its mirrored metrics fill its row of the runs table."""
    import layerflow as lf
    from engine.runs.history import row_value

    add_profile(slurm_env, tmp_path, nproc_per_node=1)
    p = lf.Project.load(project(tmp_path, dp=1, steps=3000, log_interval=10))
    sweep = {"name": "hpc-lrs", "parameters": {"training.optimizer.lr": [0.001, 0.005]}, "steps": 3000,
             "stop": {"rules": [{"metric": "lr", "above": 0.002, "at_step": 20}]}}
    rows = p.sweep(sweep, cluster="hpc")
    assert [row_value(r, "lr") for r in rows] == [0.001, 0.005], rows
    done, stopped = rows
    assert done["state"] == "succeeded" and done["step"] == 3000 and done["final_loss"] is not None, done
    assert stopped["state"].startswith("stopped early: lr above 0.002 at step 20"), stopped
    jobs = sorted((j for j in JobDB().list() if j.name.startswith("hpc-lrs")), key=lambda j: j.name)
    assert [j.state for j in jobs] == ["succeeded", "cancelled"], [(j.name, j.state) for j in jobs]
    assert len({j.extra["slurm_id"] for j in jobs}) == 2  # a Slurm job each
    for j in jobs:
        assert j.extra["slurm_id"] not in slurm_env.cluster.jobs()
        assert job_processes(j.token) == []


def test_a_preempted_job_checkpoints_is_requeued_resumes_and_equals_an_unbroken_run(slurm_env, tmp_path, config_dir):
    """One job, preempted twice while it trains (dp=2), no checkpoint of its own (the
    interval is past the end: each stop must write one): first Slurm's warning (what
    --signal=B:USR1@GRACE sends the batch shell; the batch script passes it to the workers,
    which checkpoint and stop, then requeues the job), then `scontrol requeue` (Slurm's own
    SIGTERM to every step, no cancel request). Each time the job shows as resuming with its
    Slurm id, Slurm starts it again (the test lifts the BeginTime hold Slurm puts on a
    requeued job) and the run goes on from the checkpoint of its stop. It ends succeeded,
    its losses step for step those of an unbroken local run, no step missing or twice, one
    lineage in attempts.jsonl, and nothing left running."""
    steps = 1200
    proj = project(tmp_path, dp=2, steps=steps, checkpoint_interval=10 ** 6)
    add_profile(slurm_env, tmp_path)
    job_id = cli("deploy", str(proj), "--cluster", "hpc").stdout.strip().splitlines()[-1]
    job = JobDB().get(job_id)
    sid, run = job.extra["slurm_id"], Path(job.nodes[0].jobdir) / "run"
    states: list[str] = []
    tr = Tracker(job_id, on_state=lambda j: states.append(j.state))

    def slurm(*args: str) -> str:
        return slurm_env.cluster.run(*args).stdout.strip()

    def preempt_and_resume(how: list[str], after_step: int, restarts: int) -> int:
        wait_for(lambda: tr.poll().state == "running" and (tr.job.step or 0) >= after_step, timeout=180,
                 what=f"the job trains past step {after_step}")
        slurm(*how)
        job = wait_for(lambda: (j := tr.poll()).state == "resuming" and j.extra["slurm"]["state"] == "PENDING" and j,
                       timeout=60, what="the job is requeued and waits in the queue")
        assert job.extra["slurm"]["restarts"] == str(restarts) and not job.done
        st = json.loads((run / "status.json").read_text())
        assert st["state"] == "preempted", st  # it checkpointed where it stopped
        assert (run / "checkpoints" / "latest").read_text().strip() == f"step_{st['step']}"
        assert f"{job_id} " in (jobs := cli("jobs", "--no-refresh").stdout) and f"resuming (BeginTime), Slurm {sid}" in jobs
        slurm("scontrol", "update", f"JobId={sid}", "StartTime=now")  # (Slurm holds a requeued job back ~2 min)
        return st["step"]

    try:
        first = preempt_and_resume(["scancel", "--batch", "--signal=USR1", sid], 20, 1)  # the warning
        second = preempt_and_resume(["scontrol", "requeue", sid], first + 20, 2)  # Slurm's own SIGTERM
        job = tr.follow(interval=0.5)
    finally:
        tr.close()
    assert job.state == "succeeded", (job.state, job.error)
    assert "preempted" in states and states[-1] == "succeeded"
    out = (run.parent / f"slurm-{sid}.out").read_text()
    assert "Slurm warns of a preemption" in out and "requeued to go on" in out
    assert f"resuming from step_{first}" in out and f"resuming from step_{second}" in out

    remote = losses(run / "metrics.jsonl")  # (asserts no step twice)
    assert sorted(remote) == list(range(1, steps + 1))
    recs = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["event"], r["step"]) for r in recs if r.get("event") in ("preempted", "restart")] == [
        ("preempted", first), ("restart", first), ("preempted", second), ("restart", second)]
    attempts = [json.loads(ln) for ln in (run / "attempts.jsonl").read_text().splitlines()]
    assert [a["attempt"] for a in attempts] == [0, 1, 2]
    assert [a["resumed_from"] for a in attempts] == [None, first, second]
    assert all(a["after"]["preempted"] and a["after"]["error"] == "preempted" for a in attempts[1:])
    mirrored = losses(JobDB().mirror_dir(job_id) / "metrics.jsonl")  # the tracker's copy, through both cuts
    assert mirrored == remote

    local = tmp_path / "local"
    cli("train", str(proj), "--nproc", "2", "--out", str(local))
    mine = losses(local / "metrics.jsonl")
    assert sorted(mine) == sorted(remote)
    for s in remote:
        assert remote[s] == pytest.approx(mine[s], rel=1e-4, abs=1e-6), s
    assert job_processes(job.token) == [] and sid not in slurm_env.cluster.jobs()
