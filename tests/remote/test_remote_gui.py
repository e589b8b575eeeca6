"""The clusters dialog and the jobs panel (Qt offscreen) against the real sshd."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

pytest.importorskip("PySide6")

from app.cluster_dialog import ClusterDialog  # noqa: E402
from app.jobs_panel import JobsController, JobsPanel  # noqa: E402
from remote.cluster import ClusterStore  # noqa: E402
from remote.jobs import JobDB  # noqa: E402

from sshd_helpers import REMOTE_PYTHON, USER  # noqa: E402
from test_remote_tracker import fake_job, start_node  # noqa: E402

pytestmark = pytest.mark.gui


def fill(dlg, env, tmp_path, known_hosts):
    dlg.new_cluster()
    dlg.name.setText("lab")
    dlg.hosts.setRowCount(0)
    for s in env.servers:
        dlg.add_host_row(s.addr, s.port, USER, str(env.client_key))
    dlg.workdir.setText(str(tmp_path / "work"))
    dlg.python.setText(REMOTE_PYTHON)
    dlg.env.setPlainText("OMP_NUM_THREADS=1")
    dlg.known_hosts.setText(str(known_hosts))


def test_cluster_dialog_save_test_and_trust_a_key(qtbot, sshd_pair, config_dir, tmp_path):
    dlg = ClusterDialog()
    qtbot.addWidget(dlg)
    kh = tmp_path / "kh"  # empty: both hosts unknown
    fill(dlg, sshd_pair, tmp_path, kh)
    assert dlg.save()
    c = ClusterStore().get("lab")
    assert [h.port for h in c.hosts] == [s.port for s in sshd_pair.servers] and c.env == {"OMP_NUM_THREADS": "1"}
    asked = []
    dlg.ask_trust = lambda parent, host, kind, fp: asked.append(fp) or True
    dlg.test_connection()
    qtbot.waitUntil(lambda: not dlg.busy and "all hosts ready" in dlg.report.toPlainText(), timeout=60000)
    assert len(asked) == 2  # one question per unknown host, each with its own fingerprint
    assert len(kh.read_text().splitlines()) == 2
    # refusing leaves known_hosts alone and the table says why
    kh2 = tmp_path / "kh2"
    dlg.known_hosts.setText(str(kh2))
    dlg.accepted_keys.clear()
    dlg.ask_trust = lambda *a: False
    dlg.test_connection()
    qtbot.waitUntil(lambda: not dlg.busy and "unknown host key" in dlg.report.toPlainText(), timeout=60000)
    assert not kh2.exists()


def test_cluster_dialog_bad_input_is_an_error_line(qtbot, sshd_pair, config_dir, tmp_path):
    dlg = ClusterDialog()
    qtbot.addWidget(dlg)
    fill(dlg, sshd_pair, tmp_path, tmp_path / "kh")
    dlg.hosts.item(0, 1).setText("abc")
    assert not dlg.save() and "port 'abc'" in dlg.error.text()
    dlg.hosts.item(0, 1).setText("22")
    dlg.name.setText("bad name;")
    assert not dlg.save() and "name" in dlg.error.text()
    assert ClusterStore().names() == []
    cfg = tmp_path / "ssh_config"
    s = sshd_pair.servers[1]
    cfg.write_text(f"Host gpu\n  HostName {s.addr}\n  Port {s.port}\n  User root\n")
    dlg.name.setText("")
    dlg.import_ssh_config(cfg, ["gpu"])
    assert dlg.hosts.rowCount() == 1 and dlg.hosts.item(0, 0).text() == s.addr and dlg.name.text() == "gpu"


def test_cluster_dialog_keeps_what_it_has_no_field_for_and_edits_data_paths(qtbot, config_dir, tmp_path):
    """A profile made by `cluster add --data-path ... --max-restarts 2`, opened and saved in the
    dialog, keeps its data paths and settings; a data path is edited as a line."""
    from remote.cluster import parse_cluster

    store = ClusterStore()
    store.save(parse_cluster({"name": "lab", "hosts": [{"address": "127.0.0.1"}], "max_restarts": 2,
                              "connect_timeout": 3.5, "data_paths": {str(tmp_path / "d"): "/scratch/d"}}, "t"))
    dlg = ClusterDialog()
    qtbot.addWidget(dlg)
    dlg._load("lab")
    assert dlg.data_paths.toPlainText() == f"{tmp_path / 'd'}=/scratch/d"
    dlg.workdir.setText("~/elsewhere")
    assert dlg.save()
    c = store.get("lab")
    assert (c.workdir, c.max_restarts, c.connect_timeout) == ("~/elsewhere", 2, 3.5)
    assert c.data_paths == {str(tmp_path / "d"): "/scratch/d"}
    dlg.data_paths.setPlainText(f"{tmp_path / 'd'}=/scratch/d\n{tmp_path / 'e'} = /scratch/e\n")
    assert dlg.save() and store.get("lab").data_paths == {str(tmp_path / "d"): "/scratch/d",
                                                          str(tmp_path / "e"): "/scratch/e"}
    dlg.data_paths.setPlainText("no equals sign")
    assert not dlg.save() and "no equals sign" in dlg.error.text()
    dlg.data_paths.setPlainText("relative=/x")
    assert not dlg.save() and "relative" in dlg.error.text()
    assert store.get("lab").data_paths == {str(tmp_path / "d"): "/scratch/d", str(tmp_path / "e"): "/scratch/e"}


def test_cluster_dialog_edits_restarts_and_the_elastic_node_bounds(qtbot, config_dir):
    """Restarts and the node bounds (`cluster add --max-restarts/--min-nodes/--max-nodes`) are
    fields of the form: shown, kept on a save, 'auto'/'the run's' for none, a bad pair an
    error line that leaves the stored profile as it was."""
    from remote.cluster import parse_cluster

    store = ClusterStore()
    store.save(parse_cluster({"name": "lab", "hosts": [{"address": "127.0.0.1"}, {"address": "127.0.0.2"}],
                              "max_restarts": 2, "min_nodes": 1, "max_nodes": 2}, "t"))
    dlg = ClusterDialog()
    qtbot.addWidget(dlg)
    dlg._load("lab")
    assert (dlg.restarts.value(), dlg.min_nodes.value(), dlg.max_nodes.value()) == (2, 1, 2)
    dlg.workdir.setText("~/w")
    assert dlg.save()
    c = store.get("lab")
    assert (c.workdir, c.max_restarts, c.min_nodes, c.max_nodes) == ("~/w", 2, 1, 2)
    dlg.restarts.setValue(-1)
    dlg.min_nodes.setValue(0)
    assert dlg.restarts.text() == "the run's" and dlg.min_nodes.text() == "auto"
    assert dlg.save()
    c = store.get("lab")
    assert (c.max_restarts, c.min_nodes, c.max_nodes) == (None, None, 2)
    dlg.min_nodes.setValue(3)
    assert not dlg.save() and "min_nodes (3) is above max_nodes (2)" in dlg.error.text()
    assert store.get("lab").min_nodes is None
    dlg.new_cluster()
    assert (dlg.restarts.value(), dlg.min_nodes.value(), dlg.max_nodes.value()) == (-1, 0, 0)


def test_jobs_panel_reattaches_follows_and_cancels(qtbot, sshd_pair, config_dir, tmp_path):
    done_job = fake_job(sshd_pair, tmp_path)
    d = Path(done_job.nodes[0].jobdir)
    p1 = start_node(done_job)
    running = fake_job(sshd_pair, tmp_path)
    p2 = start_node(running)
    controller = JobsController(db=JobDB())
    panel = JobsPanel(controller)
    qtbot.addWidget(panel)
    try:
        controller.reattach()  # both are "running" in the database: followed again
        assert set(controller.followers) == {done_job.id, running.id}
        assert set(panel.job_ids()) == {done_job.id, running.id}
        (d / "run" / "metrics.jsonl").write_text('{"step": 2, "loss": 1.0}\n')
        (d / "run" / "status.json").write_text(json.dumps({"state": "succeeded"}))
        (d / "node0.exit").write_text("0\n")
        os.killpg(p1.pid, signal.SIGTERM)
        p1.wait()

        def state_of(jid):
            for r in range(panel.table.rowCount()):
                if panel.table.item(r, 0).text() == jid:
                    return panel.table.item(r, 3).text(), panel.table.item(r, 4).text()
        qtbot.waitUntil(lambda: state_of(done_job.id) == ("succeeded", "2/3"), timeout=60000)
        cell = next(panel.table.item(r, 3) for r in range(panel.table.rowCount())
                    if panel.table.item(r, 0).text() == done_job.id)
        assert cell.toolTip() == "succeeded"  # and the column is wide enough to read it whole
        assert panel.table.columnWidth(3) >= panel.table.fontMetrics().horizontalAdvance("succeeded")
        panel.select_job(running.id)
        assert panel.buttons["Cancel"].isEnabled()
        panel.buttons["Cancel"].click()
        qtbot.waitUntil(lambda: state_of(running.id)[0] == "cancelled", timeout=60000)
        assert p2.wait(timeout=30) is not None
        opened = []
        panel.open_requested.connect(opened.append)
        panel.buttons["Open"].click()
        assert opened == [str(JobDB().mirror_dir(running.id))]
    finally:
        controller.shutdown()
        for p in (p1, p2):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
