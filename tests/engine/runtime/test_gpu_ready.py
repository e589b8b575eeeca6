"""Issue 57 ("ready for the first GPU"): what a GPU would show and the CPU tests did not,
checked here where the CPU allows (real trainers, real torchrun/gloo processes; a GPU's
own behaviour, such as queued kernels or nvidia-smi, is stood in for only where named)."""
import time

import pytest


def test_a_log_steps_time_includes_the_device_work_still_queued(tmp_path, monkeypatch):
    """loop.MetricLogger reads the clock after waiting for the device: on a GPU the steps
    only queue their kernels, and a clock read before the log step's sync leaves their run
    time out (samples_per_s inflated). The GPU's queue is stood in for by a wait of 0.2 s."""
    from test_compile_runtime import mlp, train

    from engine.runtime import loop

    waits = []

    def queued_work(device):  # (a CUDA stream with 0.2 s of kernels still to run)
        waits.append(str(device))
        time.sleep(0.2)

    monkeypatch.setattr(loop, "wait_for_device", queued_work)
    _, recs, _ = train(mlp("off", steps=3), tmp_path / "run")
    logged = [r for r in recs if "samples_per_s" in r]
    assert len(logged) == 3 and waits == ["cpu"] * 3
    for r in logged:  # 32 samples a step, each step at least 0.2 s
        assert r["samples_per_s"] <= 32 / 0.2, r


def test_wait_for_device_on_the_cpu_returns():
    from engine.runtime.loop import wait_for_device

    wait_for_device("cpu")
    wait_for_device(None)
