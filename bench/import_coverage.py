"""What comes in, and how well: one row per architecture the tests define (written like
their public reference code, narrow: tests/models/real_models.py, reference_models.py,
hf_models.py), every cell measured here, none typed by hand.

    python bench/import_coverage.py [--only ResNet-18,GPT] [--steps 3] [--no-dist]

Columns:
- module: `from_module` (torch.export) imports it; the diagram equals the source (the
  import checks that itself, 1e-4 of the output's scale).
- torch's ONNX: `torch.onnx.export(model, dynamo=True)` with a dynamic batch, then
  `import_onnx` of that file; the diagram's outputs against the source's on a batch of 5
  (max relative error).
- params: the module import's parameter count against the source's ("exact", else both
  and the import's reason).
- export: the imported project written with `export_onnx`.
- onnxruntime: that file run by onnxruntime against the source, batch 5 (max relative error).
- train 1 / dp=2 / pp=2: the `train` command (`--steps`, synthetic data of the input's
  shape), one process, then `--nproc 2 --dp 2` and `--nproc 2 --pp 2` on torchrun; the
  last step's loss, and for dp/pp the largest relative difference of the step losses
  from the one-process run. Models without BatchNorm or dropout agree to float
  rounding; with them the runs differ by design, not by fault: BatchNorm's statistics
  are per rank under dp (unless placement.sync_batchnorm) and per micro-batch under pp,
  and dropout draws its masks per rank.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "models"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from engine.diagram.compile import compile_graph  # noqa: E402
from engine.interop import export_onnx, import_onnx, save_imported  # noqa: E402
from engine.interop.module.importer import from_module  # noqa: E402
from engine.project import load_project, save_project  # noqa: E402
from engine.runs.tail import read_metrics  # noqa: E402


def _archs() -> dict:
    """name -> (constructor, input shape without the batch, dtype)."""
    from hf_models import BertForSequenceClassification, LlamaForCausalLM, T5EncoderForClassification
    from reference_models import ConvNeXtTV, GoogLeNet, SwinTransformer
    from real_models import GPT, EfficientNet, MobileNetV2, ResNet18, VisionTransformer

    img, tok = "float32", "int64"
    return {
        "ResNet-18": (ResNet18, [3, 32, 32], img),
        "MobileNetV2": (MobileNetV2, [3, 32, 32], img),
        "EfficientNet-B0": (EfficientNet, [3, 32, 32], img),
        "ConvNeXt": (ConvNeXtTV, [3, 32, 32], img),
        "ViT": (VisionTransformer, [3, 16, 16], img),
        "Swin": (SwinTransformer, [3, 32, 32], img),
        "GoogLeNet": (GoogLeNet, [3, 32, 32], img),
        "GPT": (GPT, [16], tok),
        "Llama": (LlamaForCausalLM, [12], tok),
        "BERT": (BertForSequenceClassification, [10], tok),
        "T5 encoder": (T5EncoderForClassification, [10], tok),
    }


def _batch(shape, dtype, n=5, seed=1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == "int64":
        return torch.randint(0, 30, (n, *shape), generator=g)
    return torch.randn((n, *shape), generator=g)


def _rel(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-6))


def _why(exc: BaseException) -> str:
    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"FAIL: {line[:90]}"


def _agree(err: float) -> str:
    return f"ok ({err:.0e})" if err < 1e-4 else f"FAIL: differs by {err:.1e}"


def _onnx_cells(model, shape, dtype, tmp: Path) -> str:
    """torch.onnx.export of the source, imported back, against the source."""
    try:
        prog = torch.onnx.export(model, (_batch(shape, dtype, n=3),), dynamo=True,
                                 dynamic_shapes=({0: torch.export.Dim("batch", min=1)},))
        path = tmp / "torch.onnx"
        prog.save(str(path))
        imp = import_onnx(path)
        gm = compile_graph(imp.project.graph).build(seed=0)
        gm.load_state_dict(imp.state)
        x = _batch(shape, dtype)
        with torch.no_grad():
            return _agree(_rel(gm.eval()(x).numpy(), model(x).numpy()))
    except Exception as exc:  # noqa: BLE001 - a cell says what went wrong
        return _why(exc)


def _params(imp, model) -> str:
    got, want = compile_graph(imp.project.graph).total_params, sum(p.numel() for p in model.parameters())
    if got == want:
        return f"exact ({want:,})"
    if not imp.project.left_out:
        return f"FAIL: {got:,} of {want:,}, unexplained"
    why = imp.project.left_out[0].partition("not in the diagram: ")[2] or imp.project.left_out[0]
    return f"{got:,} of {want:,} ({why.split(' (')[0].split(';')[0]}, named)"


def _export_cells(project, model, shape, dtype, tmp: Path) -> tuple[str, str]:
    import onnxruntime as ort

    try:
        path = export_onnx(project, tmp / "layerflow.onnx")
    except Exception as exc:  # noqa: BLE001
        return _why(exc), "-"
    try:
        sess = ort.InferenceSession(str(path))
        x = _batch(shape, dtype)
        got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
        with torch.no_grad():
            return "ok", _agree(_rel(got, model(x).numpy()))
    except Exception as exc:  # noqa: BLE001
        return "ok", _why(exc)


def _train(path: Path, out: Path, steps: int, extra: list[str]) -> tuple[list[float] | None, str]:
    """The `train` command as a user runs it: (the step losses, or None and why)."""
    cmd = [sys.executable, str(ROOT / "main.py"), "train", str(path), "--steps", str(steps), "--out", str(out), *extra]
    try:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return None, "FAIL: over 900 s"
    if r.returncode != 0:
        lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip() and not ln.startswith("warning:")]
        return None, f"FAIL: {(lines[-1] if lines else f'exit {r.returncode}')[:90]}"
    return [x["loss"] for x in read_metrics(out / "metrics.jsonl") if "loss" in x], ""


def _train_cells(project, tmp: Path, steps: int, dist: bool) -> list[str]:
    project.training.batch_size = 8
    project.training.eval_interval = 10_000
    project.training.log_interval = 1
    path = tmp / "train.lflow"
    save_project(project, path)
    one, why = _train(path, tmp / "one", steps, [])
    cells = [why or f"ok (loss {one[-1]:.3f})"]
    for label, extra in (("dp2", ["--nproc", "2", "--dp", "2"]),
                         ("pp2", ["--nproc", "2", "--pp", "2", "--microbatches", "2"])):
        if not dist:
            cells.append("not run")
            continue
        losses, why = _train(path, tmp / label, steps, extra)
        if losses is None or one is None:
            cells.append(why or "ok (no 1-process run to compare)")
        elif len(losses) != len(one):
            cells.append(f"FAIL: {len(losses)} steps logged of {len(one)}")
        else:
            cells.append(f"ok (Δ {_rel(losses, one):.0e})")
    return cells


def row(name: str, steps: int, dist: bool) -> list[str]:
    ctor, shape, dtype = _archs()[name]
    torch.manual_seed(0)
    model = ctor().eval()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        onnx_cell = _onnx_cells(model, shape, dtype, tmp)
        try:
            imp = from_module(model, [shape], [dtype])
        except Exception as exc:  # noqa: BLE001
            return [name, _why(exc), onnx_cell, "-", "-", "-", "-", "-", "-"]
        project = load_project(save_imported(imp, tmp / "imported.lflow"))  # as a user's file reads back
        export, ort_cell = _export_cells(project, model, shape, dtype, tmp)
        return [name, "ok", onnx_cell, _params(imp, model), export, ort_cell, *_train_cells(project, tmp, steps, dist)]


HEADERS = ["architecture", "module", "torch's ONNX", "params", "export", "onnxruntime", "train 1", "dp=2", "pp=2"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated architecture names (default: all)")
    ap.add_argument("--steps", type=int, default=3, help="training steps per run (default 3)")
    ap.add_argument("--no-dist", action="store_true", help="skip the dp=2 and pp=2 runs (torchrun)")
    args = ap.parse_args()
    names = [n.strip() for n in args.only.split(",")] if args.only else list(_archs())
    unknown = [n for n in names if n not in _archs()]
    if unknown:
        sys.exit(f"unknown architecture(s) {unknown}; known: {', '.join(_archs())}")
    rows, start = [], time.perf_counter()
    for name in names:
        t = time.perf_counter()
        rows.append(row(name, args.steps, not args.no_dist))
        print(f"{name}: {time.perf_counter() - t:.0f} s", file=sys.stderr)
    print("| " + " | ".join(HEADERS) + " |")
    print("|" + "---|" * len(HEADERS))
    for r in rows:
        print("| " + " | ".join(c.replace("|", "/") for c in r) + " |")
    print(f"\n{len(rows)} architectures, {args.steps} training steps per run, "
          f"{time.perf_counter() - start:.0f} s in all", file=sys.stderr)


if __name__ == "__main__":
    main()
