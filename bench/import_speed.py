"""How long real models take to import, against torch.export alone.

    python bench/import_speed.py [--repeat 3]

Rows: a GPT (nanoGPT style, tied embedding) of 8 and of 48 blocks (about 200 and
1,000 diagram nodes), a ResNet of 2x4 basic blocks, and DenseNet-121 from the onnx
package's model zoo (ONNX, read op by op as torch calls). Columns: diagram nodes, Op
(generic) nodes among them, torch.export time, the whole import (export + reading
the graph + compiling the diagram + checking its outputs against the source), and
their ratio. Best of --repeat runs.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "models"))

import onnx  # noqa: E402
import torch  # noqa: E402

from engine.interop.module.importer import _export, _sample, from_module  # noqa: E402
from real_models import GPT, ResNet  # noqa: E402


def best(fn, repeat: int) -> tuple[float, object]:
    out, times = None, []
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    _export(GPT(n_layer=1).eval(), [_sample([16], "int64")], "warm-up")  # torch.export's first call pays for imports
    cases = [("GPT, 8 blocks", lambda: GPT(n_layer=8), [16], "int64"),
             ("GPT, 48 blocks", lambda: GPT(n_layer=48), [16], "int64"),
             ("ResNet 2x4 blocks", lambda: ResNet(layers=(4, 4)), [3, 16, 16], "float32")]
    rows = []
    for name, ctor, shape, dtype in cases:
        torch.manual_seed(0)
        m = ctor().eval()
        samples = [_sample(shape, dtype)]
        t_export, _ = best(lambda: _export(m, samples, name), args.repeat)
        t_import, imp = best(lambda: from_module(m, [shape], [dtype]), args.repeat)
        nodes = imp.project.graph.nodes.values()
        rows.append((name, len(nodes), sum(n.type == "Op" for n in nodes), t_export, t_import))

    from engine.interop import import_onnx
    from test_onnx_zoo import LIGHT, randomized

    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "densenet121.onnx"
        onnx.save(randomized(LIGHT / "light_densenet121.onnx"), str(path))
        t_import, imp = best(lambda: import_onnx(path), args.repeat)
        nodes = imp.project.graph.nodes.values()
        rows.append(("DenseNet-121 (ONNX)", len(nodes), sum(n.type == "Op" for n in nodes), float("nan"), t_import))

    print(f"{'model':<22}{'nodes':>7}{'Op':>6}{'export s':>10}{'import s':>10}{'import/export':>15}")
    for name, n, ops, te, ti in rows:
        ratio = f"{ti / te:.2f}" if te == te else "-"
        print(f"{name:<22}{n:>7}{ops:>6}{te:>10.2f}{ti:>10.2f}{ratio:>15}")


if __name__ == "__main__":
    main()
