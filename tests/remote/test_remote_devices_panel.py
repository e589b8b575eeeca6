"""The devices panel's "Devices" source: a cluster's real devices (preflight over the
real sshd pair, on a worker thread) fill the panel and size the editor's plan."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("PySide6")

from PySide6.QtWidgets import QMessageBox  # noqa: E402

from app.window import MainWindow  # noqa: E402
from engine.project import load_project  # noqa: E402
from remote.cluster import ClusterStore, parse_cluster  # noqa: E402

from sshd_helpers import free_port  # noqa: E402

pytestmark = pytest.mark.gui
EXAMPLE = Path(__file__).resolve().parents[2] / "resources" / "examples" / "mlp_digits.lflow"


@pytest.fixture
def window(qtbot, config_dir, monkeypatch):
    # an unsaved diagram at teardown is discarded, not asked about
    monkeypatch.setattr(MainWindow, "ask", lambda self, kind, title, text, buttons, default:
                        QMessageBox.StandardButton.Discard)
    w = MainWindow(load_project(EXAMPLE))
    qtbot.addWidget(w)
    yield w
    w.device_source.wait()


def pick(panel, name):
    """As a person would: open the list (it refills from the profiles) and choose `name`."""
    panel.source.showPopup()
    panel.source.hidePopup()
    i = panel.source.findData(name)
    assert i > 0, [panel.source.itemText(j) for j in range(panel.source.count())]
    panel.source.setCurrentIndex(i)
    panel.source.activated.emit(i)


def test_cluster_devices_fill_the_panel_and_size_the_plan(qtbot, sshd_pair, window, tmp_path):
    ClusterStore().save(parse_cluster(sshd_pair.cluster("lab", tmp_path / "work")))
    w, panel = window, window.devices
    pick(panel, "lab")
    assert w.device_source.busy  # the preflight runs on a worker: the GUI thread is already back here
    qtbot.waitUntil(lambda: not w.device_source.busy, timeout=60000)
    assert w.device_source.error is None and panel.device_error.isHidden()
    report = w.device_source.report
    assert [h.ok for h in report.hosts] == [True, True] and not any(h.gpus for h in report.hosts)
    assert not panel.device_list.isHidden()
    listed = panel.device_list.text().splitlines()
    for s in sshd_pair.servers:  # both hosts, each as CPU processes (no nvidia-smi here)
        assert any(f"{s.addr}:{s.port}" in line and "CPU: 1 process" in line for line in listed), listed
    # the plan now counts the cluster's 2 processes: pp*dp*tp = 1 is refused, dp = 2 fits
    plan = w.controller.plan
    assert plan.doc["nproc"] == 2 and any("2 are available" in e for e in plan.errors)
    w.controller.set_mesh("dp", 2)
    w.controller.flush()
    plan = w.controller.plan
    assert plan.ok, plan.errors
    assert plan.doc["nproc"] == plan.doc["world"] == 2
    smallest = min(h.mem_bytes for h in report.hosts)
    assert plan.doc["device"]["name"] == "cpu" and plan.doc["device"]["memory_bytes"] == smallest
    # back to this machine: the list goes and the plan is local again
    pick_local = panel.source.findData(None)
    panel.source.setCurrentIndex(pick_local)
    panel.source.activated.emit(pick_local)
    assert panel.device_list.isHidden() and w.controller.devices is None
    assert w.controller.plan.ok and w.controller.plan.doc["nproc"] == 2  # from the placement now
    assert w.project.cluster is None


def test_the_project_remembers_its_cluster(qtbot, sshd_pair, window, tmp_path):
    """The chosen cluster is saved with the project (its name only) and chosen again on open."""
    ClusterStore().save(parse_cluster(sshd_pair.cluster("lab", tmp_path / "work")))
    w = window
    pick(w.devices, "lab")
    assert w.project.cluster == "lab" and w.is_dirty()
    qtbot.waitUntil(lambda: not w.device_source.busy, timeout=60000)
    assert w.save_as(tmp_path / "p.lflow")
    assert '"cluster": "lab"' in (tmp_path / "p.lflow").read_text()
    again = MainWindow(load_project(tmp_path / "p.lflow"))
    qtbot.addWidget(again)
    try:
        assert again.device_source.cluster_name == "lab" and again.devices.source.currentData() == "lab"
        qtbot.waitUntil(lambda: not again.device_source.busy, timeout=60000)
        assert again.device_source.devices is not None and again.controller.devices == again.device_source.devices
        assert not again.is_dirty()
    finally:
        again.device_source.wait()


def test_a_project_naming_an_unknown_cluster_says_so(qtbot, config_dir, monkeypatch):
    monkeypatch.setattr(MainWindow, "ask", lambda self, *a: QMessageBox.StandardButton.Discard)
    project = load_project(EXAMPLE)
    project.cluster = "elsewhere"
    w = MainWindow(project)
    qtbot.addWidget(w)
    text = w.devices.device_error.text()
    assert "'elsewhere'" in text and "Clusters" in text and w.controller.devices is None
    assert w.devices.source.currentData() is None  # this machine


def test_unreachable_or_unknown_cluster_is_an_error_line(qtbot, sshd_pair, window, tmp_path):
    store = ClusterStore()
    dead = {"address": "127.0.0.1", "port": free_port("127.0.0.1"), "user": "root"}
    store.save(parse_cluster(sshd_pair.cluster("gone", tmp_path / "w1", hosts=[dead], connect_timeout=3)))
    (tmp_path / "empty_kh").write_text("")
    store.save(parse_cluster(sshd_pair.cluster("stranger", tmp_path / "w2", known_hosts=str(tmp_path / "empty_kh"))))
    w, panel = window, window.devices
    before = w.controller.plan.doc["nproc"]
    pick(panel, "gone")
    qtbot.waitUntil(lambda: not w.device_source.busy, timeout=60000)
    assert not panel.device_error.isHidden() and f"127.0.0.1:{dead['port']}" in panel.device_error.text()
    assert w.controller.devices is None and w.controller.plan.doc["nproc"] == before  # the plan stays local
    pick(panel, "stranger")
    qtbot.waitUntil(lambda: not w.device_source.busy, timeout=60000)
    text = panel.device_error.text()
    assert "unknown host key" in text and all(f"{s.addr}:{s.port}" in text for s in sshd_pair.servers), text


def test_gpu_hosts_are_listed_per_gpu_and_small_gpus_fail_the_plan():
    """No GPU here: hosts as preflight reports them from nvidia-smi's real CSV output."""
    from app.devices_source import device_lines, procs_per_node
    from engine.planning.planner import make_plan
    from remote.preflight import HostReport, PreflightReport, device_spec, parse_nvidia_smi

    smi = "0, NVIDIA A100-SXM4-80GB, 81920, 1024, 0\n1, NVIDIA A100-SXM4-80GB, 81920, 81920, 100\n"
    hosts = [HostReport(f"root@10.0.0.{i}", ok=True, gpus=parse_nvidia_smi(smi)[0], cpus=64) for i in (1, 2)]
    report = PreflightReport(hosts)
    cluster = parse_cluster({"name": "gpus", "hosts": [{"address": "10.0.0.1"}, {"address": "10.0.0.2"}]})
    lines = device_lines(cluster, report)
    assert len(lines) == 4 and "root@10.0.0.2  GPU 1: NVIDIA A100-SXM4-80GB  81920 MiB, 0 MiB free" in lines
    assert procs_per_node(cluster, report) == [2, 2]
    project = load_project(EXAMPLE)
    project.placement = project.placement.derive(dp=4)
    plan = make_plan(project, 4, device_spec(report, 2))  # the full GPU (0 MiB free) bounds every rank
    assert plan.doc["device"]["memory_bytes"] == 0
    assert any("NVIDIA A100-SXM4-80GB device has" in e for e in plan.errors), plan.errors
