"""Preflight against the real sshd pair, and nvidia-smi parsing on captured output formats
(no GPU here: these strings are what `nvidia-smi --query-gpu=index,name,memory.total,
memory.used,utilization.gpu --format=csv,noheader,nounits` prints on real machines)."""
from __future__ import annotations

import platform

from remote.cluster import parse_cluster
from remote.preflight import check_devices, device_spec, parse_nvidia_smi, preflight

from sshd_helpers import USER, free_port

A100_X2 = "0, NVIDIA A100-SXM4-80GB, 81920, 0, 0\n1, NVIDIA A100-SXM4-80GB, 81920, 40211, 97\n"
CONSUMER_NA = "0, NVIDIA GeForce RTX 3090, 24576, 1234, [N/A]\n"
MIG_UNSUPPORTED = "0, NVIDIA H100 80GB HBM3, 81559, [N/A], [Not Supported]\n"
DRIVER_DOWN = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that "
               "the latest NVIDIA driver is installed and running.\n")
NO_DEVICES = "No devices were found\n"


def test_parse_nvidia_smi_formats():
    gpus, warn = parse_nvidia_smi(A100_X2)
    assert [(g.index, g.name, g.memory_total_mb, g.memory_used_mb, g.utilization) for g in gpus] == [
        (0, "NVIDIA A100-SXM4-80GB", 81920, 0, 0), (1, "NVIDIA A100-SXM4-80GB", 81920, 40211, 97)]
    assert warn == [] and gpus[1].memory_free_mb == 81920 - 40211
    (g,), _ = parse_nvidia_smi(CONSUMER_NA)
    assert g.utilization is None and g.memory_used_mb == 1234
    (g,), _ = parse_nvidia_smi(MIG_UNSUPPORTED)
    assert g.memory_used_mb is None and g.memory_free_mb is None and g.name == "NVIDIA H100 80GB HBM3"
    for text in (DRIVER_DOWN, NO_DEVICES):
        gpus, warn = parse_nvidia_smi(text)
        assert gpus == [] and len(warn) == 1 and "line 1" in warn[0]
    assert parse_nvidia_smi("") == ([], [])
    (g,), _ = parse_nvidia_smi("3, Weird, Name GPU, 16384, 1, 2\r\n\n")
    assert (g.index, g.name, g.memory_total_mb) == (3, "Weird, Name GPU", 16384)


def test_device_spec_from_gpus():
    from remote.preflight import HostReport, PreflightReport
    gpus, _ = parse_nvidia_smi(A100_X2)
    spec = device_spec(PreflightReport([HostReport("a", ok=True, gpus=gpus)]))
    assert spec.name == "NVIDIA A100-SXM4-80GB" and spec.memory_bytes == (81920 - 40211) * 2 ** 20
    assert spec.flops_per_s == 0.4 * 312e12  # the A100 entry of engine/planning/cost.py
    (odd,), _ = parse_nvidia_smi("0, Some Future GPU, 1000, [N/A], [N/A]")
    assert device_spec(PreflightReport([HostReport("b", ok=True, gpus=[odd])])).memory_bytes == 1000 * 2 ** 20


def test_check_devices():
    from remote.preflight import GPU, HostReport, PreflightReport
    gpu = GPU(0, "x", 100.0, 0.0, 0.0)
    rep = PreflightReport([HostReport("a", ok=True, gpus=[gpu]), HostReport("b", ok=True, gpus=[gpu])])
    assert check_devices(rep, 2, 1) == []
    errs = check_devices(rep, 4, 2)
    assert any("only 1 GPU" in e for e in errs)
    assert "needs 3 processes" in check_devices(rep, 3, 1)[0]
    busy = GPU(0, "x", 100.0, 90.0, 50.0)
    rep = PreflightReport([HostReport("a", ok=True, gpus=[gpu]), HostReport("b", ok=True, gpus=[busy])])
    assert check_devices(rep, 2, 1, peak_bytes=50 * 2 ** 20) == [
        "b: GPU 0 (x), local rank 0's, has 10 MiB free but the plan needs 50 MiB per rank; raise pp or tp, "
        "lower batch_size, or free the GPU"]
    assert check_devices(rep, 2, 1, peak_bytes=5 * 2 ** 20) == []


def test_preflight_two_hosts(sshd_pair, tmp_path):
    c = parse_cluster(sshd_pair.cluster("pair", tmp_path / "work", rdzv_port=free_port("127.0.0.2")))
    rep = preflight(c)
    assert rep.ok, rep.table()
    for h in rep.hosts:
        assert h.torch and h.python and h.cpus >= 1 and h.gpus == [] and h.free_disk_gb > 0 and h.rdzv_ok
    cpu = device_spec(rep, nproc_per_node=2)
    assert cpu.name == "cpu" and 0 < cpu.memory_bytes <= min(h.mem_bytes for h in rep.hosts) // 2
    table = rep.table()
    assert "127.0.0.2" in table and "127.0.0.3" in table and "NO" not in table
    # optional packages reported, never a failure: TensorBoard's version or its absence
    from importlib import metadata

    try:
        here = metadata.version("tensorboard")
    except metadata.PackageNotFoundError:
        here = None
    for h in rep.hosts:
        assert set(h.optional) == {"tensorboard", "nvidia-ml-py"}
        if h.python == platform.python_version():  # (the test hosts run this interpreter)
            assert h.optional["tensorboard"] == here
        assert (f"tensorboard {here}" if here else "no tensorboard") in h.optional_text()
        assert "nvidia-ml-py" not in h.optional_text()  # no GPUs here
    # the interface gloo/NCCL will bind on each node: the one reaching the rendezvous address (loopback here)
    assert all(h.socket_ifname == "lo" and "lo" in h.interfaces for h in rep.hosts), rep.hosts
    net = [n for n in rep.notes if n.startswith("network: ")]
    assert len(net) == 1 and "set by the runtime" in net[0] and net[0].count(" lo") == 2, rep.notes
    assert net[0] in table


def test_preflight_names_the_failing_host(sshd_pair, tmp_path):
    data = sshd_pair.cluster("pair", tmp_path / "work", rdzv_port=free_port("127.0.0.2"))
    data["hosts"][1]["port"] = free_port("127.0.0.3")  # nobody listens there
    rep = preflight(parse_cluster(data))
    assert not rep.ok
    assert rep.hosts[0].ok and not rep.hosts[1].ok
    assert rep.failures == [f"{USER}@127.0.0.3:{data['hosts'][1]['port']}: " + rep.hosts[1].error]
    assert "cannot connect" in rep.hosts[1].error
    bad_py = parse_cluster(sshd_pair.cluster("pair", tmp_path / "work", n_hosts=1, python="/nonexistent/python"))
    rep = preflight(bad_py)
    assert not rep.ok and "does not run" in rep.hosts[0].error


def test_rendezvous_port_in_use(sshd_pair, tmp_path):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.2", 0))
    s.listen(1)
    try:
        c = parse_cluster(sshd_pair.cluster("pair", tmp_path / "w", rdzv_port=s.getsockname()[1], n_hosts=1))
        rep = preflight(c, timeout=5)
        assert not rep.ok and "rendezvous" in rep.hosts[0].error
    finally:
        s.close()


# `nvidia-smi --query-gpu=index,pci.bus_id,uuid,name,memory.total,memory.used,utilization.gpu
# --format=csv,noheader,nounits` (preflight's NVIDIA_QUERY) as a 4-GPU H100 node prints it, GPU 0
# taken by another job (its bus ids and uuids are of the form nvidia-smi writes)
H100_X4_GPU0_BUSY = """0, 00000000:18:00.0, GPU-4f6a4b2c-0b1e-7a3d-9c55-2e8f1a6b7c01, NVIDIA H100 80GB HBM3, 81559, 78020, 100
1, 00000000:2A:00.0, GPU-8d1e2f3a-4b5c-6d7e-8f90-a1b2c3d4e502, NVIDIA H100 80GB HBM3, 81559, 1, 0
2, 00000000:3A:00.0, GPU-1a2b3c4d-5e6f-7081-92a3-b4c5d6e7f803, NVIDIA H100 80GB HBM3, 81559, 1, 0
3, 00000000:5D:00.0, GPU-c0ffee00-1234-5678-9abc-def012345604, NVIDIA H100 80GB HBM3, 81559, 1, 0
"""
# a workstation: nvidia-smi's order is the PCI bus's (the small card first), CUDA's default
# (FASTEST_FIRST) would put the RTX 4090 first
WORKSTATION = """0, 00000000:01:00.0, GPU-aaaaaaaa-1111-2222-3333-444444444401, NVIDIA T400 4GB, 4096, 300, 2
1, 00000000:41:00.0, GPU-bbbbbbbb-1111-2222-3333-444444444402, NVIDIA GeForce RTX 4090, 24564, 10, 0
"""


def test_preflight_checks_the_gpus_ranks_will_use_in_cudas_order():
    """Local rank r takes cuda:r, the r-th GPU by PCI bus id (the runtime sets
    CUDA_DEVICE_ORDER=PCI_BUS_ID, so CUDA numbers GPUs as nvidia-smi does), of
    CUDA_VISIBLE_DEVICES where the node sets it. Before, preflight checked the GPUs with
    the most free memory: a busy GPU 0 passed while rank 0 would run on it."""
    from remote.preflight import HostReport, PreflightReport, cuda_order, rank_gpus

    gpus, warn = parse_nvidia_smi(H100_X4_GPU0_BUSY)
    assert warn == [] and [g.index for g in gpus] == [0, 1, 2, 3]
    assert gpus[0].pci_bus_id == "00000000:18:00.0" and gpus[3].uuid.startswith("GPU-c0ffee00")
    assert gpus[0].name == "NVIDIA H100 80GB HBM3" and gpus[0].memory_free_mb == 81559 - 78020
    need = 20 * 2 ** 30
    node = HostReport("n1", ok=True, gpus=gpus)
    errs = check_devices(PreflightReport([node]), 2, 2, peak_bytes=need)
    assert errs == ["n1: GPU 0 (NVIDIA H100 80GB HBM3), local rank 0's, has 3539 MiB free but the plan needs "
                    "20480 MiB per rank; raise pp or tp, lower batch_size, or free the GPU"]
    # the node's shell hides GPU 0: ranks 0, 1 take GPUs 2 and 3 (by index, or by uuid prefix)
    for visible in ("2,3", "GPU-1a2b3c4d,GPU-c0ffee00"):
        node.cuda_visible_devices = visible
        assert [g.index for g in rank_gpus(gpus, 2, visible)[0]] == [2, 3]
        assert check_devices(PreflightReport([node]), 2, 2, peak_bytes=need) == []
    node.cuda_visible_devices = "3"
    assert check_devices(PreflightReport([node]), 2, 2) == [
        "n1: CUDA_VISIBLE_DEVICES=3 leaves 1 GPU(s) for 2 processes per node"]
    # nvidia-smi lines out of bus order (as read back from a capture sorted otherwise): CUDA's order is the bus's
    ws, _ = parse_nvidia_smi("".join(reversed(WORKSTATION.splitlines(keepends=True))))
    assert [g.name for g in cuda_order(ws)] == ["NVIDIA T400 4GB", "NVIDIA GeForce RTX 4090"]
    errs = check_devices(PreflightReport([HostReport("ws", ok=True, gpus=ws)]), 1, 1, peak_bytes=8 * 2 ** 30)
    assert errs and "GPU 0 (NVIDIA T400 4GB), local rank 0's" in errs[0]  # (not the 4090 with the most memory)
    # the query the probe runs, and the older captures without bus id and uuid still read
    from remote.preflight import NVIDIA_QUERY

    assert "index,pci.bus_id,uuid,name,memory.total,memory.used,utilization.gpu" in NVIDIA_QUERY
    (old,), _ = parse_nvidia_smi("1, NVIDIA A100-SXM4-80GB, 81920, 40211, 97\n")
    assert old.pci_bus_id is None and old.memory_used_mb == 40211


def test_the_runtime_numbers_cuda_devices_in_pci_order(monkeypatch):
    """The runtime sets CUDA_DEVICE_ORDER=PCI_BUS_ID before CUDA starts (a user's own setting kept)."""
    from engine.runtime.distributed.mesh import cuda_device_order

    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    cuda_device_order()
    import os

    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    cuda_device_order()
    assert os.environ["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"


def test_network_notes_name_the_profiles_interface_and_a_node_without_it():
    from remote.preflight import HostReport, network_notes

    c = parse_cluster({"name": "two", "hosts": [{"address": "10.0.0.1"}, {"address": "10.0.0.2"}], "env": {"GLOO_SOCKET_IFNAME": "ib0",
                                                                               "NCCL_SOCKET_IFNAME": "ib0"}})
    hosts = [HostReport("a", ok=True, socket_ifname="eth0", interfaces=["lo", "eth0", "ib0"]),
             HostReport("b", ok=True, socket_ifname="eth0", interfaces=["lo", "eth0"])]
    notes = network_notes(c, hosts)
    assert notes[0] == "network: GLOO_SOCKET_IFNAME=ib0, NCCL_SOCKET_IFNAME=ib0 (the profile's env)"
    assert notes[1].startswith("WARNING b: GLOO_SOCKET_IFNAME=ib0 but the node's interfaces are lo, eth0")
    assert network_notes(c, hosts[:1]) == []  # one node: nothing crosses a network
    c2 = parse_cluster({"name": "two", "hosts": [{"address": "10.0.0.1"}, {"address": "10.0.0.2"}]})
    hosts[1].socket_ifname = None
    notes = network_notes(c2, hosts)
    assert notes[0].endswith("reaches the rendezvous address 10.0.0.1:29400: a eth0, b ?")
    assert notes[1].startswith("WARNING b: no interface found that reaches 10.0.0.1:29400")
