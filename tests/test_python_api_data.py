"""`lf.inspect`, `lf.pack` and `Project.use_data` on generated data (Pillow images in class
folders, numpy token files, pyarrow Parquet): what they report and write, that the run
builder takes the project they leave, and one-line `lf.DataError`s for bad input."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import layerflow as lf

from tests.engine.runtime.test_datasets import make_images, make_npz, make_parquet, make_tokens


def mlp(tmp_path: Path, shape=(64,), classes=10) -> lf.Project:
    p = lf.Project.new("m", steps=2, batch_size=4)
    x = p.add("Input", id="x", shape=list(shape))
    h = p.add("ReLU", p.add("Linear", p.add("Flatten", x), out_features=16))
    p.add("Output", p.add("Linear", h, id="head", out_features=classes), loss="cross_entropy")
    p.save(tmp_path / "m.lflow")
    return p


def test_the_api_is_exported_and_documented():
    for name in ("inspect", "pack", "DataError", "DataReport", "DataUse", "Packed"):
        assert name in lf.__all__ and hasattr(lf, name)
    assert "lf.inspect(" in lf.__doc__ and "use_data(" in lf.__doc__ and "lf.pack(" in lf.__doc__
    assert issubclass(lf.DataError, lf.LayerflowError) and issubclass(lf.DataError, ValueError)
    from engine.runtime.datasets import DataError as RuntimeDataError

    assert issubclass(lf.DataError, RuntimeDataError)


def test_inspect_an_image_folder(tmp_path):
    make_images(tmp_path / "imgs", per_class=5)
    r = lf.inspect(tmp_path / "imgs", image_size=12, samples=2, seconds=0.1)
    assert isinstance(r, lf.DataReport)
    assert r.samples["train"] + r.samples["val"] == 15 and r.classes == ["cat", "dog", "eel"]
    assert r.info["spec"]["x"] == {"shape": [3, 12, 12], "dtype": "float32"} and r.samples_per_s > 0
    assert r.info["examples"][0]["image"].shape == (12, 12, 3) and r.unreadable == []
    files = r.save_previews(tmp_path / "prev")
    assert [f.name for f in files] == ["sample-000000.png", "sample-000000-augmented.png",
                                       f"sample-{r.info['examples'][1]['index']:06d}.png",
                                       f"sample-{r.info['examples'][1]['index']:06d}-augmented.png"]
    text = str(r)
    assert "classes: 3" in text and "#" in text and "samples/s" in text and "image previews: 4 PNGs" in text
    d = json.loads(json.dumps(r.to_dict()))  # plain JSON
    assert d["previews"] == [str(f) for f in files] and d["settings"]["kind"] == "image_folder"


def test_pack_text_and_read_it_back(tmp_path):
    (tmp_path / "a.txt").write_text("first file\n" * 30)
    (tmp_path / "b.txt").write_text("second file\n" * 30)
    seen = []
    packed = lf.pack([tmp_path / "a.txt", tmp_path / "b.txt"], tmp_path / "tok", val_fraction=0.2,
                     progress=lambda done, total: seen.append((done, total)))
    assert isinstance(packed, lf.Packed) and packed.kind == "token_file" and packed.path == tmp_path / "tok"
    total = (tmp_path / "a.txt").stat().st_size + (tmp_path / "b.txt").stat().st_size
    assert packed.meta["tokens"] == {"train": total - round(total * 0.2), "val": round(total * 0.2)}
    assert seen[-1] == (total, total) and packed.dataset == {"kind": "token_file", "path": str(tmp_path / "tok")}
    r = lf.inspect(packed.path, seq_len=10, samples=1, seconds=0.1)
    assert r.info["text"] == "first file\n" and r.info["vocab_size"] == 256 and r.classes is None
    # a folder of text files packs them all, in name order
    (tmp_path / "texts").mkdir()
    for name in ("b.txt", "a.txt"):
        (tmp_path / "texts" / name).write_text(name * 50)
    assert lf.pack(tmp_path / "texts", tmp_path / "tok2").meta["sources"] == ["a.txt", "b.txt"]


def test_pack_images_npz_and_csv(tmp_path):
    make_images(tmp_path / "imgs", per_class=4, split_dirs=True)
    sh = lf.pack(tmp_path / "imgs", tmp_path / "sh", shard_size=5)
    assert sh.kind == "shards" and sh.meta["samples"] == {"train": 12, "val": 9}
    assert lf.inspect(sh.path, image_size=8, seconds=0.1).classes == ["cat", "dog", "eel"]
    arr = lf.pack(make_npz(tmp_path / "d.npz", n=50), tmp_path / "arr")
    assert arr.kind == "array" and arr.meta["x_train"] == [50, 5]
    r = lf.inspect(arr.path, seconds=0.1)
    assert r.samples == {"train": 50, "val": 30} and r.info["n_classes"] == 4
    (tmp_path / "t.csv").write_text("".join(f"{i},{i % 3}\n" for i in range(20)))
    c = lf.pack(tmp_path / "t.csv", tmp_path / "csv", header=False, target=1)
    assert c.meta == {"x": [20, 1], "y": [20]} and np.load(tmp_path / "csv" / "y.npy").tolist()[:4] == [0, 1, 2, 0]


def test_use_data_fits_the_input_and_the_builder_takes_it(tmp_path):
    from engine.runs.build import build_run

    make_images(tmp_path / "imgs", per_class=6)
    p = mlp(tmp_path)
    used = p.use_data(tmp_path / "imgs", image_size=8)
    assert isinstance(used, lf.DataUse) and p.training.dataset.kind == "image_folder"
    assert p.training.dataset.path == "imgs"  # inside the project's folder: relative to it
    assert "node 'x' (Input): shape is [64] but the data set's samples are [3, 8, 8]; set the Input's shape to " \
           "[3, 8, 8]" in used.mismatches
    assert "node 'head' (Linear): outputs 10 values per sample but the data set has 3 classes" in used.mismatches
    used = p.use_data(tmp_path / "imgs", fit=True)
    assert used.changes == ["node 'x' (Input): shape [64] -> [3, 8, 8], dtype float32 -> float32"]
    assert p.core.graph.nodes["x"].params["shape"] == [3, 8, 8] and p.training.dataset.image_size == 8
    assert used.mismatches == ["node 'head' (Linear): outputs 10 values per sample but the data set has 3 classes"]
    p.set("head", out_features=3)
    assert p.use_data(tmp_path / "imgs").mismatches == []
    p.save()
    built = build_run(lf.Project.load(p.path).core, tmp_path / "run")
    spec = json.loads((tmp_path / "run" / "run.json").read_text())
    assert built.spec.data.source["path"] == str((tmp_path / "imgs").resolve())
    assert spec["data"]["n_classes"] == 3 and not (tmp_path / "run" / "data.npz").exists()  # read in place


def test_use_data_follows_the_input_and_fits_named_inputs(tmp_path):
    make_tokens(tmp_path / "tok", vocab=256)
    p = mlp(tmp_path, shape=(16,), classes=256)
    used = p.use_data(tmp_path / "tok")
    assert p.training.dataset.seq_len == 16 and used.notes == ["seq_len 16 from node 'x' (Input)"]
    assert any("node 'x' (Input): dtype is float32" in m for m in used.mismatches)

    make_parquet(tmp_path / "t.parquet", n=40)
    q = lf.Project.new("two", steps=2)
    ids = q.add("Input", id="input_ids", shape=[4], dtype="int64")
    mask = q.add("Input", id="attention_mask", shape=[4], dtype="int64")
    e = q.add("Embedding", ids, num_embeddings=16, embedding_dim=8)
    assert mask == "attention_mask"  # fed by the data, left unused by this small model
    q.add("Output", q.add("Linear", q.add("Flatten", e), id="head", out_features=5), loss="cross_entropy")
    used = q.use_data(tmp_path / "t.parquet", seq_len=8, fit=True)
    assert q.training.dataset.inputs == ["input_ids", "attention_mask"] and q.training.dataset.target == "label"
    assert sorted(used.changes) == [
        "node 'attention_mask' (Input): shape [4] -> [8], dtype int64 -> int64",
        "node 'input_ids' (Input): shape [4] -> [8], dtype int64 -> int64"]
    assert q.core.graph.nodes["input_ids"].params["shape"] == [8]


def test_bad_input_is_one_line_and_leaves_the_project_as_it_was(tmp_path):
    def one_line(fn, *needles):
        with pytest.raises(lf.DataError) as e:
            fn()
        msg = str(e.value)
        assert "\n" not in msg, msg
        for n in needles:
            assert n in msg, msg

    one_line(lambda: lf.inspect(tmp_path / "nope"), "nope: nothing found at this path")
    make_images(tmp_path / "imgs", per_class=2)
    (tmp_path / "imgs" / "fox").mkdir()
    one_line(lambda: lf.inspect(tmp_path / "imgs", seconds=0.1), "imgs/fox: empty class folder")
    one_line(lambda: lf.pack(tmp_path / "imgs", tmp_path / "sh"), "imgs/fox: empty class folder")
    one_line(lambda: lf.inspect(tmp_path / "imgs", kind="csv"), "kind 'csv' is not one of")
    one_line(lambda: lf.inspect(tmp_path / "imgs", flip="maybe"), "training.dataset: flip:")
    one_line(lambda: lf.pack(tmp_path / "imgs", tmp_path / "o", tokenizer=tmp_path / "t.json"),
             "only text is tokenized")
    make_parquet(tmp_path / "t.parquet")
    one_line(lambda: lf.inspect(tmp_path / "t.parquet", inputs=["f1"], target="nope"), "t.parquet: no column 'nope'")

    p = mlp(tmp_path)
    before = p.core.dumps()
    one_line(lambda: p.use_data(tmp_path / "t.parquet", inputs=["missing"], target="label"),
             "t.parquet: no column 'missing'")
    one_line(lambda: p.use_data(tmp_path / "imgs", fit=True), "imgs/fox: empty class folder")
    one_line(lambda: p.use_data(tmp_path / "nowhere"), "nowhere: nothing found")
    assert p.core.dumps() == before
