"""The cost model's deterministic properties: the CPU calibration (measured once,
kept per process and on disk, leaving the caller's torch settings alone) and the
structure of the step and communication formulas. No timed assertions: how close
the predictions come to measured steps is bench/dist_overhead.py's job."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from engine.planning import cost
from engine.planning.cost import DeviceSpec, bubble_fraction, comm_time, cpu_calibration, local_cpu, measure_cpu, step_time

DEV = DeviceSpec("test", 2**30, flops_per_s=1e10, link_bytes_per_s=1e9, latency_s=1e-5, update_bytes_per_s=1e9)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty cache folder and no calibration held by this process."""
    monkeypatch.setenv("LAYERFLOW_CACHE_DIR", str(tmp_path))
    cpu_calibration.cache_clear()
    yield tmp_path / "cpu_calibration.json"
    cpu_calibration.cache_clear()


def _settled(path, figures: dict[int, tuple[float, float]]) -> None:
    """A cache file as SAMPLES processes leave it: {threads: (flops_per_s, update_bytes_per_s)}."""
    path.write_text(json.dumps({cost._cpu_key(n): {"flops_per_s": f, "update_bytes_per_s": u, "samples": cost.SAMPLES}
                                for n, (f, u) in figures.items()}))


def _finite_positive(*xs) -> bool:
    return all(math.isfinite(x) and x > 0 for x in xs)


# ----- calibration -------------------------------------------------------------
def test_measurement_leaves_threads_rng_and_grad_mode_as_they_were():
    before_threads = torch.get_num_threads()
    torch.set_num_threads(2)
    rng = torch.get_rng_state()
    try:
        with torch.no_grad():
            rec = measure_cpu(1)
            assert not torch.is_grad_enabled()
        assert torch.get_num_threads() == 2
        assert torch.equal(torch.get_rng_state(), rng)
    finally:
        torch.set_num_threads(before_threads)
    assert _finite_positive(rec["flops_per_s"], rec["update_bytes_per_s"])


def test_calibration_is_measured_once_and_kept_on_disk(fresh_cache):
    first = local_cpu(1, threads=1)
    assert _finite_positive(first.flops_per_s, first.update_bytes_per_s, first.link_bytes_per_s, first.latency_s)
    assert local_cpu(1, threads=1) == first  # the same process: the same numbers, no second measurement
    saved = json.loads(fresh_cache.read_text())
    (key, rec), = saved.items()
    assert "1 threads" in key and rec["flops_per_s"] == first.flops_per_s and rec["samples"] == 1
    # once SAMPLES processes have measured, a new process reads the file: put recognisable numbers there
    _settled(fresh_cache, {1: (1.25e9, 3.5e8)})
    cpu_calibration.cache_clear()
    again = local_cpu(1, threads=1)
    assert (again.flops_per_s, again.update_bytes_per_s) == (1.25e9, 3.5e8)


def test_the_first_processes_keep_the_best_figures(fresh_cache):
    """Before SAMPLES measurements, a process measures again and keeps the faster of
    its own figures and the file's: one busy moment does not stick."""
    key = cost._cpu_key(1)
    fresh_cache.write_text(json.dumps({key: {"flops_per_s": 1.0, "update_bytes_per_s": 1e30, "samples": 1}}))
    dev = local_cpu(1, threads=1)
    rec = json.loads(fresh_cache.read_text())[key]
    assert 1.0 < dev.flops_per_s == rec["flops_per_s"] and dev.update_bytes_per_s == rec["update_bytes_per_s"] == 1e30
    assert rec["samples"] == 2


def test_a_broken_cache_file_is_measured_again(fresh_cache):
    fresh_cache.write_text("{not json")
    dev = local_cpu(1, threads=1)
    assert _finite_positive(dev.flops_per_s, dev.update_bytes_per_s)
    assert len(json.loads(fresh_cache.read_text())) == 1


def test_thread_counts_are_calibrated_apart_and_workers_get_omp_num_threads(fresh_cache, monkeypatch):
    _settled(fresh_cache, {1: (1e9, 1e8), 2: (2e9, 2e8)})
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert cost.worker_threads() == 2 and local_cpu(1).flops_per_s == 2e9 * min(1, cost._cores() / 2)
    monkeypatch.delenv("OMP_NUM_THREADS")  # remote/launch/local.py's default
    assert cost.worker_threads() == 1 and local_cpu(1).flops_per_s == 1e9


@pytest.mark.skipif(not hasattr(__import__("os"), "sched_setaffinity"), reason="needs Linux CPU affinity")
def test_more_processes_than_cores_share_them(fresh_cache):
    import os

    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})  # this process may use one core
    try:
        _settled(fresh_cache, {1: (1e9, 1e8)})
        assert local_cpu(1, threads=1).flops_per_s == 1e9
        two = local_cpu(2, threads=1)
        assert two.flops_per_s == 0.5e9 and two.update_bytes_per_s == 0.5e8
        assert two.memory_bytes == local_cpu(1, threads=1).memory_bytes // 2
    finally:
        os.sched_setaffinity(0, allowed)


# ----- step time ---------------------------------------------------------------
@pytest.mark.parametrize("p,m,v", [(2, 4, 1), (4, 8, 1), (4, 4, 2), (3, 6, 3)])
def test_equal_stages_idle_for_the_bubble(p, m, v):
    """Equal stages: the step is the ideal time over (1 - bubble), bubble = (p-1)/(v*m+p-1)."""
    flops = 3e9
    t = step_time([flops] * p, m, DEV, 0.0, v)
    assert t["compute_s"] == pytest.approx(flops / DEV.flops_per_s / (1 - bubble_fraction(p, m, v)))


def test_more_micro_batches_shrink_the_bubble_and_the_step():
    steps = [step_time([1e9, 1e9, 1e9, 1e9], m, DEV, 0.0)["compute_s"] for m in (4, 8, 16, 32)]
    bubbles = [bubble_fraction(4, m) for m in (4, 8, 16, 32)]
    assert steps == sorted(steps, reverse=True) and len(set(steps)) == 4
    assert bubbles == sorted(bubbles, reverse=True) and bubble_fraction(4, 4) == pytest.approx(3 / 7)
    assert bubble_fraction(1, 8) == 0


def test_an_uneven_pipeline_is_paced_by_its_slowest_rank():
    """A heavy first stage and a light last one: the step is the heavy rank's work plus
    the light rank's share of fill and drain, between max and sum of the stages."""
    heavy, light, m = 2e9, 2e7, 4
    c = step_time([heavy, light], m, DEV, 0.0)["compute_s"]
    assert c == pytest.approx((heavy + light / m) / DEV.flops_per_s)
    assert heavy / DEV.flops_per_s < c < (heavy + light) / DEV.flops_per_s
    assert step_time([light, heavy], m, DEV, 0.0)["compute_s"] == pytest.approx(c)  # order does not matter


def test_one_rank_and_the_parts_of_a_step():
    t = step_time([1e10], 1, DEV, 0.25, state_bytes=[4e8])
    assert t == pytest.approx({"compute_s": 1.0, "update_s": 0.4, "comm_s": 0.25, "step_s": 1.65})
    # the optimizer step follows the rank with the most state; no rate: not modelled
    assert step_time([1e9, 1e9], 2, DEV, 0.0, state_bytes=[1e8, 3e8])["update_s"] == pytest.approx(0.3)
    assert step_time([1e10], 1, replace(DEV, update_bytes_per_s=None), 0.0, state_bytes=[4e8])["update_s"] == 0


# ----- communication -----------------------------------------------------------
@pytest.mark.parametrize("op", ["all-reduce", "all-gather", "reduce-scatter", "send/recv"])
def test_comm_time_grows_with_bytes_and_messages(op):
    times = [comm_time(op, nb, 4, DEV) for nb in (0, 1 << 10, 1 << 20, 1 << 30)]
    assert times == sorted(times) and len(set(times)) == 4 and times[0] > 0  # latency alone for no bytes
    assert comm_time(op, 1 << 20, 4, DEV, messages=8) > comm_time(op, 1 << 20, 4, DEV, messages=1)


def test_ring_factors_and_latency_counts():
    nb, n = 1 << 20, 4
    ar, ag, rs = (comm_time(op, nb, n, DEV) for op in ("all-reduce", "all-gather", "reduce-scatter"))
    # all-reduce = reduce-scatter then all-gather: twice the bytes and the 2(n-1) steps
    assert ar == pytest.approx(ag + rs) and ag == pytest.approx(rs)
    assert ag == pytest.approx((n - 1) / n * nb / DEV.link_bytes_per_s + (n - 1) * DEV.latency_s)
    assert comm_time("send/recv", nb, 2, DEV) == pytest.approx(nb / DEV.link_bytes_per_s + DEV.latency_s)
    assert comm_time("all-reduce", nb, 1, DEV) == 0  # a group of one moves nothing
