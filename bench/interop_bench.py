"""Interop timings on the bundled examples, as ratios against plain PyTorch.

    python bench/interop_bench.py [--steps 30]

Columns: ONNX export and import times (seconds), onnxruntime inference time over
torch eager (batch 64, same weights; < 1 means onnxruntime is faster), and the
exported script's training time over Layerflow's runtime for the same steps (the
same loop, so about 1; the losses are equal, checked here too).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from engine.diagram.compile import compile_graph  # noqa: E402
from engine.interop import export_onnx, export_script, import_onnx  # noqa: E402
from engine.project import load_project  # noqa: E402
from engine.runs.build import prepare_run  # noqa: E402
from engine.runtime.train import run  # noqa: E402
from engine.runs.tail import read_metrics  # noqa: E402

EXAMPLES = ["mlp_digits", "cnn_digits", "resnet_synthetic", "transformer_synthetic"]


def best_of(fn, n: int = 30) -> float:
    fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    import onnxruntime as ort

    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name in EXAMPLES:
            project = load_project(ROOT / "resources" / "examples" / f"{name}.lflow")
            t = time.perf_counter()
            path = export_onnx(project, tmp / f"{name}.onnx")
            t_export = time.perf_counter() - t
            t = time.perf_counter()
            imported = import_onnx(path)
            t_import = time.perf_counter() - t
            result = compile_graph(project.graph)
            gm = result.build(seed=project.training.seed).eval()
            inp = result.nodes[result.spec["inputs"][0]].out
            x = torch.zeros((64, *inp.shape), dtype=torch.int64) if inp.dtype == "int64" else torch.randn(64, *inp.shape)
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = 1
            sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
            feed = {sess.get_inputs()[0].name: x.numpy()}
            with torch.no_grad():
                t_torch = best_of(lambda: gm(x))
            t_ort = best_of(lambda: sess.run(None, feed))

            rd = prepare_run(project, tmp / f"run_{name}", steps=args.steps)
            run(rd)
            rt = [r for r in read_metrics(rd / "metrics.jsonl") if "loss" in r]
            script = export_script(project, tmp / f"{name}.py")
            env = dict(os.environ, OMP_NUM_THREADS="1")
            subprocess.run([sys.executable, str(script), "--steps", str(args.steps), "--out", str(tmp / f"s_{name}")],
                           check=True, env=env, capture_output=True)
            sc = [json.loads(line) for line in (tmp / f"s_{name}" / "metrics.jsonl").read_text().splitlines()]
            equal = all(a["loss"] == b["loss"] for a, b in zip(rt, sc)) and len(rt) == len(sc)
            rows.append((name, t_export, t_import, t_ort / t_torch, sc[-1]["time"] / rt[-1]["time"], equal,
                         len(imported.project.graph.nodes)))
    head = ("model", "export s", "import s", "ort/torch", "script/runtime", "losses equal", "nodes")
    print("  ".join(f"{h:>14}" for h in head))
    for r in rows:
        print(f"{r[0]:>14}  {r[1]:>14.2f}  {r[2]:>14.3f}  {r[3]:>14.2f}  {r[4]:>14.2f}  {str(r[5]):>14}  {r[6]:>14}")


if __name__ == "__main__":
    main()
