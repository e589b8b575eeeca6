"""bench/gpu_check.py, the script a session with a GPU runs first, cannot rot while no
GPU is lent: its --cpu-smoke form runs every one-device check (the real ResNet-50 and
GPT layouts, tiny; Layerflow's runtime against the hand loop in fp32 and bf16; the
runtime's DDP and FSDP2 wrapping at world size 1; the bundled examples; issue 47's
compile modes, float8 (emulated) against bf16 and pipeline schedules) on the CPU, and
without a GPU the plain form says so in one line."""
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
    # issue 47's rows: compile modes, float8 against bf16, each pipeline schedule at pp=2
    var = {}
    for line in table.splitlines():
        cells = line.split()
        if cells and cells[0] in ("compile", "float8", "schedule"):
            config = line[9:37].strip()  # (the config column: "gpt float8 + blocks", "pp2 1f1b")
            var[(cells[0], config.removeprefix("pp2 "))] = line
    for mode in ("off", "blocks", "whole"):
        assert ("compile", f"gpt {mode}") in var, var.keys()
    assert re.search(r"compiled 4 block\(s\) in [0-9.]+ s", var[("compile", "gpt blocks")])
    assert "compiled 1 block(s)" in var[("compile", "gpt whole")]
    f8 = [var[("float8", "gpt float8")], var[("float8", "gpt float8 + blocks")]]
    assert len(f8) == 2
    from engine.runtime import float8

    for line in f8:  # emulated where torchao is installed, else the run's own refusal line (the CPU's, first)
        if float8.has_torchao():
            assert "emulated on the CPU" in line, line
        else:
            assert "refused: placement.mixed_precision float8: cpu has no float8 matmul" in line, line
    for s in ("gpipe", "1f1b", "interleaved1f1b", "interleavedzb", "zbv", "dualpipev"):
        cells = var[("schedule", s)][37:].split()
        assert float(cells[1]) > 0 and float(cells[3]) < 1e-3  # ms/step; the losses are one process's
    assert "pipeline schedules at pp=2 (CPU, gloo)" in table
    # issue 57: the distributed trainer at world size 1 under torchrun (gloo here, NCCL on a GPU)
    assert "distributed trainer at world size 1 (torchrun, gloo (CPU smoke))" in table
    dist = {line.split()[1]: line for line in table.splitlines() if line.startswith("dist ") and " config " not in line}
    assert set(dist) >= {"ddp", "fsdp", "float8", "bf16"}, dist
    for name, line in dist.items():
        if name == "float8" and not float8.has_torchao():
            assert "refused" in line, line
            continue
        cells = line.split()
        assert float(cells[2]) > 0 and float(cells[3]) >= 0 and float(cells[6]) < float(cells[5]), line  # falling loss
    assert re.search(r"save \+ resume at step 4: losses within 0\.0e\+00", dist["ddp"]), dist["ddp"]
    if float8.has_torchao():
        assert "2 Linear in float8 (emulated), fc1-fc2 one block" in dist["float8"], dist["float8"]


def test_a_step_time_ratio_outside_half_to_double_is_a_problem():
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_check_dist import ratio_problem

    assert ratio_problem("fsdp", 0.010, 0.012) is None and ratio_problem("fsdp", 0.010, 0.0051) is None
    line = ratio_problem("fsdp", 0.010, 0.030)
    assert line.startswith("dist fsdp: predicted / measured step time 0.33 (predicted 10.00 ms, measured 30.00 ms)")
    assert "outside 0.5-2.0" in ratio_problem("bf16", 0.05, 0.01)
    assert ratio_problem("ddp", None, 0.01).startswith("dist ddp: no step time")


def test_without_a_gpu_it_says_so_in_one_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the full check runs instead")
    proc = _run(timeout=120)
    assert proc.returncode == 2
    assert proc.stdout.strip().splitlines() == [
        "no CUDA GPU here: nothing run (bench/gpu_check.py --cpu-smoke runs the same checks, tiny, on the CPU)"]
