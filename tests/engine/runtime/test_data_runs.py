"""Training on data read in place (issue 41), end to end: a project names an image folder,
a token file or an array file; build_run records a reference (never a copy); the real
runtime trains on it, in one process and under torchrun. Data generated here (Pillow
images, numpy tokens)."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.diagram.graph import Graph
from engine.project import Project, Training
from engine.runs.build import RunError, build_run, prepare_run
from engine.runtime.train import run
from engine.runs.tail import read_metrics

Image = pytest.importorskip("PIL.Image")

ROOT = Path(__file__).resolve().parents[3]
WORKER = Path(__file__).with_name("_dist_worker.py")
COLOURS = ((220, 40, 40), (40, 200, 60), (50, 70, 230))


def make_images(root: Path, per_class=16, val_per_class=4, size=20) -> Path:
    """root/train/<class>, root/val/<class>: noisy pictures of a colour per class."""
    rng = np.random.default_rng(0)
    for split, n in (("train", per_class), ("val", val_per_class)):
        for c, colour in enumerate(COLOURS):
            d = root / split / f"class_{c}"
            d.mkdir(parents=True, exist_ok=True)
            for k in range(n):
                a = np.clip(rng.normal(colour, 40, (size, size, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(a).save(d / f"{k:03d}.png")
    return root


def graph(*chain, out_loss="cross_entropy"):
    g = Graph()
    prev = None
    for i, (kind, params) in enumerate(chain):
        nid = params.pop("id", f"n{i}")
        g.add_node(kind, params, id=nid)
        if prev:
            g.connect(prev, "out", nid, "in")
        prev = nid
    g.add_node("Output", {"loss": out_loss}, id="out")
    g.connect(prev, "out", "out", "in")
    return g


def image_project(root: Path, steps=30, **training) -> Project:
    g = graph(("Input", {"shape": [3, 16, 16], "id": "x"}), ("Conv2d", {"out_channels": 8, "kernel_size": 3, "id": "conv"}),
              ("ReLU", {}), ("AdaptiveAvgPool2d", {"output_size": 1}), ("Flatten", {}),
              ("Linear", {"out_features": 3, "id": "head"}))
    ds = {"kind": "image_folder", "path": str(root), "image_size": 16, "crop_scale": [0.6, 1.0]}
    tr = Training.model_validate({"dataset": ds, "optimizer": {"name": "adam", "lr": 0.02}, "batch_size": 12,
                                  "steps": steps, "eval_interval": 10, "checkpoint_interval": 5, "log_interval": 1,
                                  **training})
    return Project(g, name="images", training=tr)


def torchrun_dp2(run_dir: Path, tmp: Path) -> None:
    """The run trained by the product's distributed trainer on 2 torchrun processes."""
    jobs = tmp / "jobs.json"
    jobs.write_text(json.dumps([{"run_dir": str(run_dir)}]))
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        str(WORKER), str(jobs)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]


def losses(rd):
    return {r["step"]: r["loss"] for r in read_metrics(rd / "metrics.jsonl") if "loss" in r}


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("data") / "colours")


def test_an_image_folder_trains_read_in_place(images, tmp_path):
    built = build_run(image_project(images), tmp_path / "run")
    rd = built.run_dir
    spec = json.loads((rd / "run.json").read_text())
    assert spec["data"]["source"]["path"] == str(images.resolve())
    assert spec["data"]["n_train"] == 48 and spec["data"]["n_val"] == 12 and spec["data"]["n_classes"] == 3
    assert spec["data"]["fingerprint"]["files"] == 60
    assert run(rd).state == "succeeded"
    # nothing of the data set was copied: no data.npz, no image, a run folder smaller than the data
    assert not (rd / "data.npz").exists() and not list(rd.rglob("*.png"))
    data_bytes = sum(p.stat().st_size for p in images.rglob("*.png"))
    run_bytes = sum(p.stat().st_size for p in rd.rglob("*") if p.is_file() and "checkpoints" not in p.parts)
    assert run_bytes < data_bytes
    got = losses(rd)
    first, last = np.mean([got[s] for s in range(1, 6)]), np.mean([got[s] for s in range(26, 31)])
    assert last < 0.5 * first, (first, last)
    evals = [r for r in read_metrics(rd / "metrics.jsonl") if "val_acc" in r]
    assert evals[-1]["val_acc"] >= 0.9
    assert "val_top5" not in evals[-1]  # three classes: top-5 says nothing


def test_resume_mid_epoch_equals_an_uninterrupted_run(images, tmp_path):
    """4 steps an epoch (48 samples, batch 12): stopped at step 7 (mid epoch 1), resumed
    from its checkpoint, every later step's loss equals the straight run's exactly: the
    same samples, the same augmentation draws, in the same order."""
    ref = prepare_run(image_project(images, steps=12), tmp_path / "ref")
    run(ref)
    rd = prepare_run(image_project(images, steps=12), tmp_path / "stopped")

    def stop_at_7(step, total, rec):
        if step == 7:
            raise KeyboardInterrupt

    assert run(rd, progress=stop_at_7).state == "cancelled"
    assert run(rd, resume=True).state == "succeeded"
    assert "resumed from step_7" in (rd / "logs" / "rank0.log").read_text()
    assert losses(rd) == losses(ref)


@pytest.mark.slow
@pytest.mark.xdist_group("torchrun")
def test_dp2_on_an_image_folder_equals_one_process(images, tmp_path):
    one = prepare_run(image_project(images, steps=8), tmp_path / "one")
    run(one)
    two = prepare_run(image_project(images, steps=8), tmp_path / "two", placement={"dp": 2})
    torchrun_dp2(two, tmp_path)
    a, b = losses(one), losses(two)
    assert sorted(b) == list(range(1, 9))
    for s in a:
        assert b[s] == pytest.approx(a[s], rel=1e-4), s


# ---- a token file: causal language modelling --------------------------------------------
def token_project(root: Path, vocab=64, embed_vocab=64, steps=60, **out_params) -> Project:
    g = graph(("Input", {"shape": [16], "dtype": "int64", "id": "tokens"}),
              ("Embedding", {"num_embeddings": embed_vocab, "embedding_dim": 32, "id": "embed"}),
              ("Linear", {"out_features": 64}), ("GELU", {}), ("Linear", {"out_features": vocab, "id": "lm_head"}))
    g.nodes["out"].params.update(out_params)
    tr = Training.model_validate({"dataset": {"kind": "token_file", "path": str(root), "seq_len": 16},
                                  "optimizer": {"name": "adam", "lr": 0.01}, "batch_size": 16, "steps": steps,
                                  "eval_interval": steps, "log_interval": 5})
    return Project(g, name="lm", training=tr)


def make_tokens(root: Path, vocab=64) -> Path:
    """A text where each token says what comes next (t -> 3t+1 mod vocab), with 10% noise."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    for name, n in (("train.bin", 20000), ("val.bin", 2000)):
        t = np.empty(n, np.int64)
        t[0] = 1
        noise = rng.random(n) < 0.1
        for i in range(1, n):
            t[i] = rng.integers(vocab) if noise[i] else (3 * t[i - 1] + 1) % vocab
        t.astype(np.uint16).tofile(root / name)
    (root / "meta.json").write_text(json.dumps({"vocab_size": vocab, "dtype": "uint16"}))
    return root


def test_a_token_file_trains_a_language_model_with_perplexity(tmp_path):
    toks = make_tokens(tmp_path / "tokens")
    rd = prepare_run(token_project(toks, label_smoothing=0.05), tmp_path / "run")
    spec = json.loads((rd / "run.json").read_text())
    assert spec["data"]["task"] == "language_model" and spec["data"]["n_classes"] == 64
    assert spec["loss_options"] == {"label_smoothing": 0.05}
    assert run(rd).state == "succeeded"
    ev = [r for r in read_metrics(rd / "metrics.jsonl") if "val_ppl" in r][-1]
    assert ev["val_ppl"] == pytest.approx(np.exp(ev["val_loss"]), rel=1e-6)
    assert ev["val_ppl"] < 8  # from 64 (uniform): the next token is mostly known
    assert 0.7 < ev["val_acc"] <= 1.0  # per token, not per sequence
    assert ev["val_top5"] >= ev["val_acc"]


def test_data_that_does_not_fit_the_diagram_is_named_before_a_run(tmp_path, images):
    toks = make_tokens(tmp_path / "tokens")
    with pytest.raises(RunError, match=r"node 'embed' \(Embedding\): the data set's vocabulary's largest id is 63 but "
                                       r"num_embeddings is 40; set num_embeddings to at least 64"):
        build_run(token_project(toks, embed_vocab=40), tmp_path / "a")
    p = image_project(images)
    p.graph.nodes["head"].params["out_features"] = 5
    p.graph.nodes["x"].params["shape"] = [3, 32, 32]
    with pytest.raises(RunError) as e:
        build_run(p, tmp_path / "b")
    msg = str(e.value)
    assert "node 'x' (Input): shape is [3, 32, 32] but the data set's samples are [3, 16, 16]" in msg
    assert not (tmp_path / "b").exists()  # nothing written
    p = image_project(images)
    p.graph.nodes["out"].params["loss"] = "mse"
    with pytest.raises(RunError, match="node 'out' \\(Output\\): loss is mse but the data set is a classification task; "
                                       "use cross_entropy"):
        build_run(p, tmp_path / "c")


def test_a_corrupt_image_is_skipped_and_counted_strict_stops_naming_it(tmp_path):
    root = make_images(tmp_path / "imgs", per_class=8, val_per_class=2)
    bad = root / "train" / "class_1" / "003.png"
    bad.write_bytes(bad.read_bytes()[:60])
    rd = prepare_run(image_project(root, steps=6, batch_size=8), tmp_path / "run")
    assert run(rd).state == "succeeded"
    skipped = [r["skipped_samples"] for r in read_metrics(rd / "metrics.jsonl") if "skipped_samples" in r]
    assert skipped[0] == 1 and skipped[-1] == 2  # 6 steps of 8 are 2 epochs of 24: it fell in both, counted twice
    p = image_project(root, steps=6, batch_size=8)
    p.training.loader = p.training.loader.model_copy(update={"strict": True})
    rd = prepare_run(p, tmp_path / "strict")
    with pytest.raises(Exception):
        run(rd)
    status = json.loads((rd / "status.json").read_text())
    assert status["state"] == "failed" and "003.png" in status["error"] and "\n" not in status["error"]


# ---- other objectives: multi-label, top-5 -----------------------------------------------
def test_multi_label_trains_with_binary_cross_entropy(tmp_path):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(600, 8)).astype(np.float32)
    y = (x[:, :4] > 0).astype(np.float32)  # label j is on when feature j is positive
    np.savez(tmp_path / "ml.npz", x=x, y=y)
    g = graph(("Input", {"shape": [8]}), ("Linear", {"out_features": 4, "id": "head"}), out_loss="bce")
    tr = Training.model_validate({"dataset": {"kind": "array", "path": str(tmp_path / "ml.npz"), "task": "multi_label",
                                              "n_classes": 4},
                                  "optimizer": {"name": "adam", "lr": 0.05}, "batch_size": 32, "steps": 60,
                                  "eval_interval": 60})
    rd = prepare_run(Project(g, name="ml", training=tr), tmp_path / "run")
    assert run(rd).state == "succeeded"
    ev = [r for r in read_metrics(rd / "metrics.jsonl") if "val_acc" in r][-1]
    assert ev["val_acc"] > 0.9  # per label
    wrong = Project(graph(("Input", {"shape": [8]}), ("Linear", {"out_features": 4})), name="ml", training=tr)
    with pytest.raises(RunError, match="loss is cross_entropy but the data set is a multi-label task; use bce"):
        build_run(wrong, tmp_path / "wrong")


def test_ten_classes_report_top5_and_ignore_index_drops_targets(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(400, 6)).astype(np.float32)
    y = rng.integers(0, 10, 400)
    np.savez(tmp_path / "c.npz", x=x, y=y)
    g = graph(("Input", {"shape": [6]}), ("Linear", {"out_features": 10}))
    tr = Training.model_validate({"dataset": {"kind": "array", "path": str(tmp_path / "c.npz")},
                                  "batch_size": 20, "steps": 4, "eval_interval": 4})
    rd = prepare_run(Project(g, name="c", training=tr), tmp_path / "run")
    run(rd)
    ev = [r for r in read_metrics(rd / "metrics.jsonl") if "val_acc" in r][-1]
    assert ev["val_acc"] <= ev["val_top5"] <= 1.0 and ev["val_top5"] > 0.25  # random: ~0.5 of 10 in the top 5

    import torch

    from engine.runtime.steps import compute_loss, eval_sums
    out = torch.randn(4, 7, 10)
    y = torch.randint(0, 10, (4, 7))
    y[:, 5:] = -1  # padding
    want = torch.nn.functional.cross_entropy(out[:, :5].reshape(-1, 10), y[:, :5].reshape(-1))
    assert torch.allclose(compute_loss("cross_entropy", out, y, {"ignore_index": -1}), want)
    sums = eval_sums("cross_entropy", out, y, {"ignore_index": -1})
    assert sums[1] == 20 and sums[4] == 20  # only the 20 real tokens are scored


# ---- several inputs: tokens and an attention mask -------------------------------------------
def test_tokens_and_an_attention_mask_feed_two_input_nodes(tmp_path):
    """A Parquet file with input_ids and attention_mask columns: each feeds the Input node
    of its name. The model pools the embeddings under the mask (mask @ embeddings), so
    padded positions carry nothing; the class is the first token's parity."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rng = np.random.default_rng(4)
    n, T = 480, 12
    lengths = rng.integers(3, T + 1, n)
    ids = rng.integers(1, 50, (n, T))
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.float32)
    ids[mask == 0] = 0
    label = (ids[:, :3].sum(1) % 2).astype(np.int64)
    ids[:, 0] = np.where(label == 1, 50 + rng.integers(0, 4, n), 54 + rng.integers(0, 4, n))  # a signal token
    table = pa.table({"input_ids": list(ids.astype(np.int64)), "attention_mask": list(mask), "label": label})
    pq.write_table(table, tmp_path / "seqs.parquet", row_group_size=64)
    def masked_graph(mask_id="attention_mask"):
        g = Graph()
        g.add_node("Input", {"shape": [T], "dtype": "int64"}, id="input_ids")
        g.add_node("Input", {"shape": [T]}, id=mask_id)
        g.add_node("Embedding", {"num_embeddings": 58, "embedding_dim": 16}, id="embed")
        g.add_node("Reshape", {"shape": [1, T]}, id="mask_row")
        g.add_node("MatMul", {}, id="pool")  # (B, 1, T) @ (B, T, 16): the sum of the unmasked embeddings
        g.add_node("Flatten", {}, id="flat")
        g.add_node("Linear", {"out_features": 2}, id="head")
        g.add_node("Output", {"loss": "cross_entropy"}, id="out")
        for a, b, port in [("input_ids", "embed", "in"), (mask_id, "mask_row", "in"), ("mask_row", "pool", "a"),
                           ("embed", "pool", "b"), ("pool", "flat", "in"), ("flat", "head", "in"), ("head", "out", "in")]:
            g.connect(a, "out", b, port)
        return g

    ds = {"kind": "parquet", "path": str(tmp_path / "seqs.parquet"), "inputs": ["input_ids", "attention_mask"],
          "target": "label", "n_classes": 2}
    tr = Training.model_validate({"dataset": ds, "optimizer": {"name": "adam", "lr": 0.03}, "batch_size": 24,
                                  "steps": 40, "eval_interval": 40, "grad_accumulation": 2})
    rd = prepare_run(Project(masked_graph(), name="masked", training=tr), tmp_path / "run")
    assert run(rd).state == "succeeded"
    ev = [r for r in read_metrics(rd / "metrics.jsonl") if "val_acc" in r][-1]
    assert ev["val_acc"] > 0.9
    # the Input nodes are matched by name: one named otherwise is named, with the names there are
    with pytest.raises(RunError) as e:
        build_run(Project(masked_graph("mask"), name="masked", training=tr), tmp_path / "renamed")
    assert "node 'mask' (Input): the data set has no input named 'mask' (it has input_ids, attention_mask)" in str(e.value)
    assert "the data set's input 'attention_mask' feeds no Input node" in str(e.value)
    tr.grad_accumulation = 1
    with pytest.raises(RunError, match="placement.pp 2: a pipeline feeds one input to its first stage"):
        build_run(Project(masked_graph(), name="masked", training=tr), tmp_path / "pp", placement={"pp": 2})
    # two inputs under torchrun, data parallel over 2 processes: the same losses as one process
    tr.steps = 6
    one = prepare_run(Project(masked_graph(), name="masked", training=tr), tmp_path / "one")
    assert run(one).state == "succeeded"
    two = prepare_run(Project(masked_graph(), name="masked", training=tr), tmp_path / "two", placement={"dp": 2})
    torchrun_dp2(two, tmp_path)
    a, b = losses(one), losses(two)
    assert sorted(b) == sorted(a) and 6 in a and all(b[s] == pytest.approx(a[s], rel=1e-4) for s in a), (a, b)


def test_a_users_npz_is_read_in_place_and_split_as_before(tmp_path):
    """kind npz: scanned in chunks when the run is built (never whole), then read where it
    lies like kind array (no data.npz in the run folder); its train/val split and its
    batches are the ones the whole arrays always gave."""
    import torch

    from engine.data.describe import load_arrays
    from engine.runs.history import confusion_matrix
    from engine.runtime.batches import Batches
    from engine.runtime.datasets import StepLoader, open_source

    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 90)
    x = (np.eye(3)[y] * 3 + rng.normal(0, 0.3, (90, 3))).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    g = graph(("Input", {"shape": [3], "id": "x"}), ("Linear", {"out_features": 3, "id": "head"}))
    tr = Training.model_validate({"dataset": {"kind": "npz", "path": "d.npz", "val_fraction": 0.2, "seed": 5},
                                  "optimizer": {"name": "adam", "lr": 0.1}, "batch_size": 8, "steps": 40,
                                  "eval_interval": 20, "log_interval": 1})
    p = Project(g, name="npz", training=tr, path=tmp_path / "p.lflow")
    rd = build_run(p, tmp_path / "run").run_dir
    spec = json.loads((rd / "run.json").read_text())
    assert not (rd / "data.npz").exists()
    src = spec["data"]["source"]
    assert src["kind"] == "npz" and src["path"] == str((tmp_path / "d.npz").resolve())
    assert spec["data"]["fingerprint"]["files"] == 1 and spec["data"]["n_train"] == 72 and spec["data"]["n_val"] == 18
    whole = load_arrays(p)  # what the runs read before: the arrays made whole and split
    for split, xs, ys in (("train", whole.x_train, whole.y_train), ("val", whole.x_val, whole.y_val)):
        part = open_source(src, split)
        got = [part.sample(i, None) for i in range(len(part))]
        assert np.array_equal(np.stack([g[0].numpy() for g in got]), xs)
        assert np.array_equal(np.array([int(g[1]) for g in got]), ys)
    old, new = Batches(whole.x_train, whole.y_train, 8, 3), StepLoader(open_source(src, "train"), 8, 3)
    for step in (0, 5, 9, 20):  # across epochs: the same batches, bit for bit
        assert all(torch.equal(a, b) for a, b in zip(old.batch(step), new.batch(step)))
    assert run(rd).state == "succeeded"
    cm = confusion_matrix(rd)
    assert np.asarray(cm["matrix"]).sum() == 18 and np.trace(np.asarray(cm["matrix"])) >= 16


def test_a_users_npz_is_checked_without_loading_it(tmp_path, monkeypatch):
    """What the whole load checked is checked by the chunked scan (chunks made tiny here),
    each in one line naming the file and the array."""
    import engine.data.describe as edata
    from engine.errors import LayerflowError

    monkeypatch.setattr(edata, "SCAN_BYTES", 64)
    g = graph(("Input", {"shape": [3], "id": "x"}), ("Linear", {"out_features": 3, "id": "head"}))

    def project(**arrays):
        np.savez(tmp_path / "d.npz", **arrays)
        tr = Training.model_validate({"dataset": {"kind": "npz", "path": "d.npz"}, "batch_size": 4, "steps": 2})
        return Project(g, name="npz", training=tr, path=tmp_path / "p.lflow")

    x = np.ones((50, 3), np.float32)
    bad = x.copy()
    bad[47, 1] = np.nan
    with pytest.raises(LayerflowError, match=r"d.npz: x holds NaN or infinite values"):
        build_run(project(x=bad, y=np.zeros(50, np.int64)), tmp_path / "r1")
    y = np.zeros(50, np.int64)
    y[44] = -2
    with pytest.raises(LayerflowError, match=r"class labels must be 0 or more, but y holds -2"):
        build_run(project(x=x, y=y), tmp_path / "r2")
    with pytest.raises(LayerflowError, match=r"x holds <U1 values; it must hold numbers"):
        build_run(project(x=np.array([["a"] * 3] * 50), y=np.zeros(50, np.int64)), tmp_path / "r3")
    g = graph(("Input", {"shape": [3], "dtype": "int64", "id": "x"}),
              ("Embedding", {"num_embeddings": 5, "embedding_dim": 4, "id": "embed"}), ("Flatten", {}),
              ("Linear", {"out_features": 3, "id": "head"}))
    ids = np.zeros((50, 3), np.int64)
    ids[45, 2] = 7  # past the chunks of the first rows: the largest id is found by the scan
    with pytest.raises(LayerflowError, match=r"embed.*7"):
        build_run(project(x=ids, y=np.arange(50) % 3), tmp_path / "r4")
    ids[45, 2] = 4
    assert build_run(project(x=ids, y=np.arange(50) % 3), tmp_path / "ok").spec.data.source["kind"] == "npz"
    import shutil

    shutil.rmtree(tmp_path / "ok")
    assert not [d for d in tmp_path.iterdir() if d.name.startswith("r")]  # nothing half made


def test_confusion_matrix_of_a_run_read_in_place(images, tmp_path):
    from engine.runs.history import confusion_matrix

    rd = build_run(image_project(images, steps=20), tmp_path / "run").run_dir
    assert run(rd).state == "succeeded"
    m = np.asarray(confusion_matrix(rd)["matrix"])
    assert m.shape == (3, 3) and m.sum() == 12
