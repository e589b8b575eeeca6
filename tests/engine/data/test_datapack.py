"""engine/data/pack.py: text to token files, image folders to tar shards, .npz/.csv to
.npy; each output is read back by the in-place readers, and a failed pack leaves nothing."""
from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.data import pack as datapack
from engine.data.inspection import inspect_source, inspect_text
from engine.data.pack import pack_array, pack_shards, pack_text
from engine.runtime.datasets import DataError, open_source

from tests.engine.runtime.test_datasets import make_images, make_npz


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name)


def test_byte_level_text_packs_to_token_files(tmp_path, monkeypatch):
    monkeypatch.setattr(datapack, "CHUNK", 7)  # many chunks: the stream must not lose a byte
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("hello world\n" * 20)
    b.write_bytes("naïve café\n".encode() * 10)
    seen = []
    meta = pack_text([a, b], tmp_path / "out", val_fraction=0.25, progress=lambda d, t: seen.append((d, t)))
    data = a.read_bytes() + b.read_bytes()
    train = np.fromfile(tmp_path / "out" / "train.bin", dtype=np.uint16)
    val = np.fromfile(tmp_path / "out" / "val.bin", dtype=np.uint16)
    assert bytes(np.concatenate([train, val]).astype(np.uint8)) == data
    assert len(val) == round(len(data) * 0.25) and meta["vocab_size"] == 256 and meta["dtype"] == "uint16"
    assert json.loads((tmp_path / "out" / "meta.json").read_text()) == meta
    assert seen[-1] == (len(data), len(data)) and leftovers(tmp_path / "out") == []
    src = open_source({"kind": "token_file", "path": "out", "seq_len": 16}, "train", tmp_path)  # vocab from meta.json
    x, y = src.sample(0, None)
    assert bytes(x.numpy().astype(np.uint8)) == data[:16] and torch.equal(y[:-1], x[1:])


class _StubTokenizer:
    """tokenizers.Tokenizer's surface that pack_text uses: one id per word, 70000 words."""

    @classmethod
    def from_file(cls, path):
        if "bad" in str(path):
            raise Exception("expected value at line 1 column 1")
        return cls()

    def get_vocab_size(self):
        return 70000

    def encode(self, text, add_special_tokens=True):
        if "BOOM" in text:
            raise RuntimeError("the tokenizer fell over")
        return types.SimpleNamespace(ids=[sum(map(ord, w)) * 7 % 70000 for w in text.split()])


def test_a_tokenizer_file_gives_its_vocabulary_and_uint32(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", types.SimpleNamespace(Tokenizer=_StubTokenizer))
    monkeypatch.setattr(datapack, "CHUNK", 10)  # chunks end at line ends: no word cut in two
    words = [f"w{k}" for k in range(300)]
    (tmp_path / "t.txt").write_text("\n".join(" ".join(words[i:i + 7]) for i in range(0, 300, 7)) + "\n")
    (tmp_path / "tokenizer.json").write_text("{}")
    meta = pack_text([tmp_path / "t.txt"], tmp_path / "out", tokenizer=tmp_path / "tokenizer.json")
    assert meta["vocab_size"] == 70000 and meta["dtype"] == "uint32" and (tmp_path / "out" / "tokenizer.json").is_file()
    ids = np.concatenate([np.fromfile(tmp_path / "out" / f, dtype=np.uint32) for f in ("train.bin", "val.bin")])
    assert ids.tolist() == _StubTokenizer().encode(" ".join(words)).ids
    (tmp_path / "bad.json").write_text("")
    with pytest.raises(DataError, match=r"bad\.json: not a readable tokenizer\.json \(expected value"):
        pack_text([tmp_path / "t.txt"], tmp_path / "o2", tokenizer=tmp_path / "bad.json")


def test_a_failed_pack_leaves_the_old_output_and_no_temporary_files(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", types.SimpleNamespace(Tokenizer=_StubTokenizer))
    (tmp_path / "t.txt").write_text("fine words\n" * 50 + "BOOM\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "train.bin").write_bytes(b"old")
    with pytest.raises(RuntimeError, match="fell over"):
        pack_text([tmp_path / "t.txt"], out, tokenizer=tmp_path / "t.txt")
    assert sorted(p.name for p in out.iterdir()) == ["train.bin"] and (out / "train.bin").read_bytes() == b"old"


def test_missing_tokenizers_package_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    (tmp_path / "t.txt").write_text("x\n")
    with pytest.raises(DataError, match=r"^a tokenizer file needs tokenizers on this node: pip install tokenizers$"):
        pack_text([tmp_path / "t.txt"], tmp_path / "out", tokenizer=tmp_path / "tok.json")


def test_bad_text_inputs(tmp_path):
    with pytest.raises(DataError, match=r"nope\.txt: not a file"):
        pack_text([tmp_path / "nope.txt"], tmp_path / "out")
    (tmp_path / "tiny.txt").write_text("ab")
    with pytest.raises(DataError, match=r"tiny\.txt: 2 tokens are too few"):
        pack_text([tmp_path / "tiny.txt"], tmp_path / "out")
    assert leftovers(tmp_path / "out") == []


def test_image_folder_packs_to_shards_that_read_the_same(tmp_path):
    make_images(tmp_path / "imgs", split_dirs=True, per_class=5)
    seen = []
    meta = pack_shards(tmp_path / "imgs", tmp_path / "sh", shard_size=4, progress=lambda d, t: seen.append((d, t)))
    assert meta["samples"] == {"train": 15, "val": 9} and meta["classes"] == ["cat", "dog", "eel"]
    assert sorted(p.name for p in (tmp_path / "sh").glob("*.tar"))[:2] == ["train-000000.tar", "train-000001.tar"]
    assert len(list((tmp_path / "sh").glob("train-*.tar"))) == 4 and seen[-1] == (24, 24)
    opts = {"image_size": 12}
    for split in ("train", "val"):
        folder = open_source({"kind": "image_folder", "path": "imgs", **opts}, split, tmp_path)
        shards = open_source({"kind": "shards", "path": "sh", **opts}, split, tmp_path)
        assert len(folder) == len(shards)
        for i in (0, len(folder) - 1):
            fx, fy = folder.sample(i, 11)
            sx, sy = shards.sample(i, 11)
            assert torch.equal(fx, sx) and int(fy) == int(sy)
    first = (tmp_path / "sh" / "train-000000.tar").read_bytes()
    pack_shards(tmp_path / "imgs", tmp_path / "sh", shard_size=4)  # packing again: the same bytes
    assert (tmp_path / "sh" / "train-000000.tar").read_bytes() == first and leftovers(tmp_path / "sh") == []


def test_compressed_npz_packs_to_npy_read_in_place(tmp_path):
    make_npz(tmp_path / "c.npz", compressed=True)
    shapes = pack_array(tmp_path / "c.npz", tmp_path / "arr")
    assert shapes == {"x_train": [120, 5], "y_train": [120], "x_val": [30, 5], "y_val": [30]}
    src = open_source({"kind": "array", "path": "arr"}, "train", tmp_path)
    with np.load(tmp_path / "c.npz") as z:
        assert np.array_equal(np.load(tmp_path / "arr" / "x_train.npy", mmap_mode="r"), z["x_train"])
        assert src.x.memory is None and np.array_equal(src.sample(7, None)[0].numpy(), z["x_train"][7])


def test_csv_packs_to_x_and_y(tmp_path, monkeypatch):
    monkeypatch.setattr(datapack, "CHUNK", 5)
    rows = ["a,b,label"] + [f"{k},{k * 0.5},{'spam' if k % 3 else 'ham'}" for k in range(40)]
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n")
    assert pack_array(tmp_path / "d.csv", tmp_path / "o", target="label") == {"x": [40, 2], "y": [40]}
    x, y = np.load(tmp_path / "o" / "x.npy"), np.load(tmp_path / "o" / "y.npy")
    assert x.dtype == np.float32 and x[3].tolist() == [3.0, 1.5] and y.dtype == np.int64
    assert json.loads((tmp_path / "o" / "classes.json").read_text()) == ["ham", "spam"] and y[:4].tolist() == [0, 1, 1, 0]
    (tmp_path / "r.csv").write_text("1,2,0.5\n3,4,1.25\n")
    pack_array(tmp_path / "r.csv", tmp_path / "r", header=False)
    assert np.load(tmp_path / "r" / "y.npy").dtype == np.float32
    src = open_source({"kind": "array", "path": "r", "val_fraction": 0.5}, "train", tmp_path)
    assert src.task == "regression" and src.sample(0, None)[0].tolist() == [1.0, 2.0]
    (tmp_path / "bad.csv").write_text("a,b\n1,2\nx,3\n")
    with pytest.raises(DataError, match=r"bad\.csv: row 3 has a value that is not a number"):
        pack_array(tmp_path / "bad.csv", tmp_path / "b")
    with pytest.raises(DataError, match=r"bad\.csv: no column 'z'"):
        pack_array(tmp_path / "bad.csv", tmp_path / "b", target="z")
    assert leftovers(tmp_path / "b") == []


# ---- data inspect --------------------------------------------------------------------
def test_inspect_an_image_folder(tmp_path):
    make_images(tmp_path / "imgs", per_class=6)
    info = inspect_source({"kind": "image_folder", "path": "imgs", "image_size": 16}, tmp_path, examples=3, seconds=0.2)
    assert info["samples"]["train"] + info["samples"]["val"] == 18 and info["classes"] == ["cat", "dog", "eel"]
    assert sum(info["histogram"]["counts"]) == info["samples"]["train"] and not info["histogram"]["sampled"]
    ex = info["examples"][0]
    assert ex["image"].shape == (16, 16, 3) and ex["image"].dtype == np.uint8 and ex["x_augmented"].shape == (3, 16, 16)
    assert not np.array_equal(ex["x"], ex["x_augmented"]) and info["throughput"]["samples_per_s"] > 0
    text = inspect_text(info)
    assert "3 classes: cat " in text and "samples/s" in text


def test_inspect_is_quick_on_a_10_gb_token_file(tmp_path):
    """A sparse 10 GB file (no disk used): counts come from its size, nothing is scanned."""
    (tmp_path / "tok").mkdir()
    with open(tmp_path / "tok" / "train.bin", "wb") as f:
        f.truncate(10 << 30)
    np.frombuffer(b"hello, tokens\n" * 100, dtype=np.uint8).astype(np.uint16).tofile(tmp_path / "tok" / "val.bin")
    (tmp_path / "tok" / "meta.json").write_text(json.dumps({"vocab_size": 256, "dtype": "uint16", "tokenizer": "byte"}))
    t0 = time.perf_counter()
    info = inspect_source({"kind": "token_file", "path": "tok", "seq_len": 1024}, tmp_path, seconds=0.3)
    assert time.perf_counter() - t0 < 5
    assert info["tokens"]["train"] == 5 << 30 and info["samples"]["train"] == ((5 << 30) - 1) // 1024
    assert info["text"] == "\0" * 1025 and info["vocab_size"] == 256 and info["throughput"]["first_batch_s"] < 2
