"""bench/gpu_check.py, the script a session with a GPU runs first, cannot rot while no
GPU is lent: its --cpu-smoke form runs every one-device check (the real ResNet-50 and
GPT layouts, tiny; Layerflow's runtime against the hand loop in fp32 and bf16; the
runtime's DDP and FSDP2 wrapping at world size 1; the bundled examples) on the CPU,
and without a GPU the plain form says so in one line."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_the_cpu_smoke_runs_every_one_device_check_and_writes_its_table(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path / "out"), OMP_NUM_THREADS="1")
    proc = _run("--cpu-smoke", env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = (tmp_path / "out" / "gpu_check.txt").read_text()
    assert table == proc.stdout
    rows = {}
    for line in table.splitlines():
        cells = line.split()
        if cells and cells[0] in ("single", "hand", "example", "world"):
            if cells[0] == "world":  # "world 1  ddp x1 ..."
                cells = ["world1", cells[2], *cells[3:]]
            rows.setdefault((cells[0], cells[1]), []).append(cells)
    for model in ("resnet50", "gpt"):
        single = rows[("single", model)]
        assert [c[2] for c in single] == ["fp32", "bf16"]
        for c in single:
            assert float(c[3]) > 0 and float(c[5]) > 0  # ms/step, Layerflow/hand ratio
            # the same weights and batches: Layerflow's logged losses are the hand loop's
            assert float(c[6]) < (1e-4 if c[2] == "fp32" else 5e-2)
    for kind in ("ddp", "fsdp"):
        assert [c[3] for c in rows[("world1", kind)]] == ["fp32", "bf16"] * 2  # two models, two precisions
    examples = {name for sec, name in rows if sec == "example"}
    assert examples == {p.stem for p in (ROOT / "resources" / "examples").glob("*.lflow")}
    assert re.search(r"predicted / measured step time: resnet50 fp32 [0-9.]+", table)
    assert "NCCL multi-rank checks: not run" in table and "PROBLEM" not in table


def test_without_a_gpu_it_says_so_in_one_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the full check runs instead")
    proc = _run(timeout=120)
    assert proc.returncode == 2
    assert proc.stdout.strip().splitlines() == [
        "no CUDA GPU here: nothing run (bench/gpu_check.py --cpu-smoke runs the same checks, tiny, on the CPU)"]
