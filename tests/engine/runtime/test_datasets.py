"""The in-place readers (engine/runtime/datasets/) on generated data: every format reads,
the step loader keeps today's batch rule in every layout, with workers and on resume, and
bad input gives one line naming the file."""
from __future__ import annotations

import io
import json
import pickle
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from engine.runtime.batches import Batches
from engine.runtime.datasets import (DataError, StepLoader, eval_batches, fingerprint, open_source,
                                     sample_seed)
from engine.runtime.datasets import arrays as arrays_mod

ROOT = Path(__file__).resolve().parents[3]


# ---- generated data ------------------------------------------------------------------
def make_images(root: Path, classes=("cat", "dog", "eel"), per_class=8, size=(24, 20), split_dirs=False,
                ext="jpg", mode="RGB") -> Path:
    rng = np.random.default_rng(1)
    splits = ("train", "val") if split_dirs else ("",)
    for s in splits:
        for c, name in enumerate(classes):
            d = root / s / name
            d.mkdir(parents=True, exist_ok=True)
            for k in range(per_class if s != "val" else 3):
                a = rng.integers(0, 255, (size[1] + k, size[0], 3), dtype=np.uint8)
                a[..., c % 3] = 255  # a class you can see
                Image.fromarray(a).convert(mode).save(d / f"{k:03d}.{ext}")
    return root


def make_tokens(root: Path, n_train=5000, n_val=800, dtype=np.uint16, vocab=256) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(2)
    rng.integers(0, vocab, n_train).astype(dtype).tofile(root / "train.bin")
    rng.integers(0, vocab, n_val).astype(dtype).tofile(root / "val.bin")
    (root / "meta.json").write_text(json.dumps({"vocab_size": vocab, "dtype": np.dtype(dtype).name}))
    return root


def make_npz(path: Path, n=120, compressed=False) -> Path:
    rng = np.random.default_rng(3)
    save = np.savez_compressed if compressed else np.savez
    save(path, x_train=rng.normal(size=(n, 5)).astype(np.float32), y_train=rng.integers(0, 4, n),
         x_val=rng.normal(size=(30, 5)).astype(np.float32), y_val=rng.integers(0, 4, 30))
    return path


def make_parquet(path: Path, n=100, group=16) -> Path:
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    ids = [list(range(k % 7 + 1)) for k in range(n)]
    table = pa.table({"input_ids": ids, "attention_mask": [[1] * len(i) for i in ids],
                      "f1": np.arange(n, dtype=np.float64), "label": np.arange(n) % 5})
    pq.write_table(table, path, row_group_size=group)
    return path


def make_shards(root: Path, n_shards=2, per_shard=10, size=16) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(4)
    for s in range(n_shards):
        with tarfile.open(root / f"data-{s:03d}.tar", "w") as tf:
            for k in range(per_shard):
                b = io.BytesIO()
                Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(b, "PNG")
                for name, data in ((f"{s}_{k:04d}.png", b.getvalue()), (f"{s}_{k:04d}.cls", str(k % 3).encode())):
                    ti = tarfile.TarInfo(name)
                    ti.size = len(data)
                    tf.addfile(ti, io.BytesIO(data))
    return root


def same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    return torch.equal(a, b)


def cat(parts):
    if isinstance(parts[0], dict):
        return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    return torch.cat(parts)


IMG = {"kind": "image_folder", "path": "imgs", "image_size": 16, "val_fraction": 0.25}


# ---- every format reads --------------------------------------------------------------
def test_image_folder_reads_both_layouts(tmp_path):
    make_images(tmp_path / "imgs")
    tr, va = open_source(IMG, "train", tmp_path), open_source(IMG, "val", tmp_path)
    assert len(tr) + len(va) == 24 and len(va) == 6 and tr.n_classes == 3 and tr.classes == ["cat", "dog", "eel"]
    assert not set(tr.files) & set(va.files)  # a split, deterministic from the seed
    assert open_source(IMG, "val", tmp_path).files == va.files
    x, y = tr.sample(0, None)
    assert x.shape == (3, 16, 16) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert tr.sample_spec() == {"x": {"shape": [3, 16, 16], "dtype": "float32"}, "y": {"shape": [], "dtype": "int64"}}
    make_images(tmp_path / "split", split_dirs=True, ext="png", mode="L")
    g = {"kind": "image_folder", "path": str(tmp_path / "split"), "image_size": 12, "channels": 1}
    tr, va = open_source(g, "train", None), open_source(g, "val", None)
    assert (len(tr), len(va)) == (24, 9) and tr.sample(3, 7)[0].shape == (1, 12, 12)


def test_webp_images_read(tmp_path):
    make_images(tmp_path / "imgs", ext="webp", per_class=2)
    assert open_source(IMG, "train", tmp_path).sample(0, 1)[0].shape == (3, 16, 16)


def test_token_file_windows(tmp_path):
    make_tokens(tmp_path / "tok")
    src = {"kind": "token_file", "path": "tok", "seq_len": 32}
    tr = open_source(src, "train", tmp_path)
    assert len(tr) == (5000 - 1) // 32 and tr.vocab_size == 256 and tr.task == "language_model"
    toks = np.fromfile(tmp_path / "tok" / "train.bin", dtype=np.uint16).astype(np.int64)
    x, y = tr.sample(3, None)
    assert torch.equal(x, torch.from_numpy(toks[96:128])) and torch.equal(y, torch.from_numpy(toks[97:129]))
    assert len(open_source(src, "val", tmp_path)) == (800 - 1) // 32


def test_token_file_one_bin_with_tail_split_uint32(tmp_path):
    toks = np.random.default_rng(0).integers(0, 70000, 1000).astype(np.uint32)
    toks.tofile(tmp_path / "corpus.bin")
    s = {"kind": "token_file", "path": "corpus.bin", "seq_len": 9, "dtype": "uint32", "vocab_size": 70000,
         "val_fraction": 0.2}
    tr, va = open_source(s, "train", tmp_path), open_source(s, "val", tmp_path)
    assert len(tr) == (800 - 1) // 9 and len(va) == (200 - 1) // 9
    assert torch.equal(va.sample(0, None)[0], torch.from_numpy(toks[800:809].astype(np.int64)))


def test_llmc_header_is_detected_and_skipped(tmp_path):
    toks = np.arange(600, dtype=np.uint16) % 300
    header = np.zeros(256, np.int32)
    header[:3] = (20240520, 1, len(toks))
    with open(tmp_path / "train.bin", "wb") as f:
        f.write(header.tobytes() + toks.tobytes())
    shutil.copy(tmp_path / "train.bin", tmp_path / "val.bin")
    s = open_source({"kind": "token_file", "path": str(tmp_path), "seq_len": 10, "vocab_size": 300}, "train", None)
    assert s.offset == 1024 and len(s) == 59 and s.sample(1, None)[0].tolist() == list(range(10, 20))


def test_array_npz_and_npy_folder_read_in_place(tmp_path):
    make_npz(tmp_path / "d.npz")
    s = open_source({"kind": "array", "path": "d.npz"}, "train", tmp_path)
    with np.load(tmp_path / "d.npz") as z:
        x_train, y_train = z["x_train"], z["y_train"]
    assert s.x.memory is None and len(s) == 120 and s.n_classes == int(y_train.max()) + 1
    x, y = s.sample(17, None)
    assert np.array_equal(x.numpy(), x_train[17]) and int(y) == y_train[17]
    (tmp_path / "f").mkdir()
    np.save(tmp_path / "f" / "x.npy", np.arange(50 * 3, dtype=np.float64).reshape(50, 3))
    np.save(tmp_path / "f" / "y.npy", np.arange(50, dtype=np.float32))
    s = open_source({"kind": "array", "path": "f", "val_fraction": 0.2}, "val", tmp_path)
    assert s.task == "regression" and len(s) == 10
    assert s.sample(0, None)[0].tolist() == [12.0, 13.0, 14.0] and s.sample(0, None)[0].dtype == torch.float32


def test_small_compressed_npz_is_read_large_one_refused(tmp_path, monkeypatch):
    make_npz(tmp_path / "c.npz", compressed=True)
    s = open_source({"kind": "array", "path": "c.npz"}, "val", tmp_path)
    assert len(s) == 30 and s.x.memory is not None
    monkeypatch.setattr(arrays_mod, "SMALL_COMPRESSED", 10)
    with pytest.raises(DataError, match=r"c\.npz: member x_train is compressed .*data pack"):
        open_source({"kind": "array", "path": "c.npz"}, "val", tmp_path)


def test_parquet_columns_groups_and_split(tmp_path):
    make_parquet(tmp_path / "t.parquet")
    s = {"kind": "parquet", "path": "t.parquet", "inputs": ["input_ids", "attention_mask"], "target": "label",
         "seq_len": 4}
    tr, va = open_source(s, "train", tmp_path), open_source(s, "val", tmp_path)
    assert len(tr) + len(va) == 100 and len(va) == 10 and tr.n_classes == 5
    x, y = va.sample(0, None)  # row 9: ids 0..2, padded to 4
    assert x["input_ids"].tolist() == [0, 1, 2, 0] and x["attention_mask"].tolist() == [1, 1, 1, 0] and int(y) == 4
    assert "t.parquet row 9" in va.where(0)
    tab = open_source({"kind": "parquet", "path": "t.parquet", "inputs": ["f1", "label"], "target": "label",
                       "task": "regression"}, "train", tmp_path)
    x, y = tab.sample(20, None)
    assert x.dtype == torch.float32 and x.shape == (2,) and y.dtype == torch.float32
    lm = open_source({"kind": "parquet", "path": "t.parquet", "inputs": ["input_ids"], "task": "language_model",
                      "seq_len": 4, "vocab_size": 8}, "train", tmp_path)
    x, y = lm.sample(2, None)  # row 2: ids 0, 1, 2 -> x [0, 1, 2, 0], y [1, 2, pad, pad]
    assert x.tolist() == [0, 1, 2, 0] and y.tolist() == [1, 2, -100, -100]
    b = next(eval_batches(va, 4))
    assert b[0]["input_ids"].shape == (4, 4) and b[1].shape == (4,)


def test_ragged_parquet_lists_without_seq_len_are_named_when_described(tmp_path):
    """Lists of 1 to 7 ids cannot stack into a batch: the build-time description says so and
    names seq_len; lists of one length, or with seq_len, describe."""
    from engine.data.describe import describe_source
    from engine.project import ProjectError

    make_parquet(tmp_path / "t.parquet")
    s = {"kind": "parquet", "path": str(tmp_path / "t.parquet"), "inputs": ["input_ids"], "target": "label"}
    with pytest.raises(ProjectError, match=r"t.parquet: column 'input_ids' holds sequences of 1 to 7 values; set "
                                           r"seq_len"):
        describe_source(s, with_fingerprint=False)
    assert describe_source({**s, "seq_len": 5}, with_fingerprint=False).sample_shape == (5,)
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"ids": [[1, 2, 3], None, [4, 5, 6]], "label": [0, 1, 1]}), tmp_path / "even.parquet")
    even = {"kind": "parquet", "path": str(tmp_path / "even.parquet"), "inputs": ["ids"], "target": "label",
            "val_fraction": 0.3}
    assert open_source(even, "train", None).sample_spec()["x"]["shape"] == [3]  # (a null row is no length)


def test_parquet_through_workers_after_the_parent_read(tmp_path):
    make_parquet(tmp_path / "t.parquet")
    src = open_source({"kind": "parquet", "path": "t.parquet", "inputs": ["input_ids", "attention_mask"],
                       "target": "label", "seq_len": 6}, "train", tmp_path)
    src.sample(0, None)  # the parent has the file open and a group cached when the workers fork
    plain = StepLoader(src, 8, 2)
    want = [plain.batch(s) for s in range(12)]  # past one epoch (11 steps)
    with StepLoader(src, 8, 2, workers=2) as par:
        got = [par.batch(s) for s in range(12)]
    assert all(same(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(want, got))
    assert got[0][0]["input_ids"].shape == (8, 6)


def test_arrow_files_as_datasets_writes_them(tmp_path):
    pa = pytest.importorskip("pyarrow")
    for split, n in (("train", 40), ("validation", 12)):
        (tmp_path / "hf" / split).mkdir(parents=True)
        table = pa.table({"tokens": [[k, k + 1] for k in range(n)], "label": np.arange(n) % 2})
        with pa.OSFile(str(tmp_path / "hf" / split / "data-00000-of-00001.arrow"), "wb") as f:
            with pa.ipc.new_stream(f, table.schema) as w:  # the streaming format datasets writes
                for b in table.to_batches(max_chunksize=16):
                    w.write_batch(b)
    s = {"kind": "parquet", "path": "hf", "inputs": ["tokens"], "target": "label"}
    tr, va = open_source(s, "train", tmp_path), open_source(s, "val", tmp_path)
    assert (len(tr), len(va)) == (40, 12) and tr.sample(33, None)[0].tolist() == [33, 34]
    assert pickle.loads(pickle.dumps(tr)).sample(17, None)[0].tolist() == [17, 18]


def test_shards_index_and_read(tmp_path):
    make_shards(tmp_path / "sh")
    for path in ("sh", "sh/data-{000..001}.tar"):
        s = {"kind": "shards", "path": path, "image_size": 8, "val_fraction": 0.25}
        tr, va = open_source(s, "train", tmp_path), open_source(s, "val", tmp_path)
        assert (len(tr), len(va)) == (15, 5) and tr.n_classes == 3
        x, y = va.sample(1, None)  # row 7: shard 0, key 7
        assert x.shape == (3, 8, 8) and int(y) == 7 % 3 and "data-000.tar sample 7" in va.where(1)


def test_sources_pickle_without_open_handles(tmp_path):
    """Workers started by spawn or forkserver get a pickled Source: it must carry no file
    handle, cache or memory map, and read the same after."""
    make_tokens(tmp_path / "tok")
    make_images(tmp_path / "imgs", per_class=2)
    make_npz(tmp_path / "d.npz")
    make_parquet(tmp_path / "t.parquet")
    make_shards(tmp_path / "sh", n_shards=1)
    for settings in ({"kind": "token_file", "path": "tok", "seq_len": 8}, IMG, {"kind": "array", "path": "d.npz"},
                     {"kind": "parquet", "path": "t.parquet", "inputs": ["input_ids"], "target": "label", "seq_len": 3},
                     {"kind": "shards", "path": "sh", "image_size": 8}):
        s = open_source(settings, "train", tmp_path)
        want = s.sample(1, 5)  # opens its files, fills its caches
        blob = pickle.dumps(s)
        assert len(blob) < 20_000, (settings["kind"], len(blob))
        t = pickle.loads(blob)
        assert not [k for k in vars(t) if k.startswith("_h")]
        got = t.sample(1, 5)
        assert same(got[0], want[0]) and torch.equal(got[1], want[1])


# ---- the step loader -----------------------------------------------------------------
def test_batches_follow_todays_rule(tmp_path):
    make_npz(tmp_path / "d.npz")
    src = open_source({"kind": "array", "path": "d.npz"}, "train", tmp_path)
    with np.load(tmp_path / "d.npz") as z:
        old = Batches(z["x_train"], z["y_train"], batch_size=16, seed=5)
    new = StepLoader(src, 16, 5, end_step=20)
    assert new.steps_per_epoch == old.steps_per_epoch == 7
    for step in range(20):  # three epochs, each a new permutation
        assert np.array_equal(new.indices(step), old.indices(step).numpy())
        x, y = new.batch(step)
        ox, oy = old.batch(step)
        assert torch.equal(x, ox) and torch.equal(y, oy)
    assert new.epoch_of(14) == 2


def test_a_large_set_is_ordered_without_a_permutation_array(tmp_path, monkeypatch):
    """Past PERM_LIMIT samples the epoch's order is computed per batch (loader.shuffled):
    still each sample once an epoch, a new order each epoch, the same batches for every
    data-parallel share and after a resume, and memory flat in the data's size."""
    from engine.runtime.datasets import loader

    for n in (1, 2, 5, 1000, 4097):  # a permutation of range(n), also where 2^2h is far above n
        assert sorted(loader.shuffled(np.arange(n), n, 7, 0).tolist()) == list(range(n))
    make_npz(tmp_path / "d.npz")
    src = open_source({"kind": "array", "path": "d.npz"}, "train", tmp_path)
    monkeypatch.setattr(loader, "PERM_LIMIT", 10)
    big = StepLoader(src, 16, 5)
    n, spe = len(src), big.steps_per_epoch
    for epoch in range(2):
        seen = np.concatenate([big.indices(epoch * spe + i) for i in range(spe)])
        assert len(set(seen.tolist())) == len(seen) == spe * 16 and seen.min() >= 0 and seen.max() < n
    assert not np.array_equal(big.indices(0), big.indices(spe))  # a new order each epoch
    assert big._perm is None  # nothing of size n was kept
    halves = [StepLoader(src, 16, 5, share=(0, 8)), StepLoader(src, 16, 5, share=(8, 16))]
    resumed = StepLoader(src, 16, 5, start_step=9)
    for step in (9, 10, 3 * spe + 1):
        x, y = big.batch(step)
        parts = [h.batch(step) for h in halves]
        assert torch.equal(torch.cat([p[0] for p in parts]), x) and torch.equal(torch.cat([p[1] for p in parts]), y)
        rx, ry = resumed.batch(step)
        assert torch.equal(rx, x) and torch.equal(ry, y)


@pytest.fixture
def images(tmp_path):
    make_images(tmp_path / "imgs", per_class=10)
    return open_source(IMG, "train", tmp_path)


def test_dp_shares_concatenate_to_the_whole_batch(images):
    whole = StepLoader(images, 8, 3)
    halves = [StepLoader(images, 8, 3, share=(0, 4)), StepLoader(images, 8, 3, share=(4, 8))]
    for step in (0, 1, 2, 5):  # 2 is in epoch 0, 5 in epoch 1 (steps_per_epoch 3)
        x, y = whole.batch(step)
        parts = [h.batch(step) for h in halves]
        assert torch.equal(x, cat([p[0] for p in parts])) and torch.equal(y, cat([p[1] for p in parts]))


def test_workers_equal_no_workers_and_a_restart_equals_a_straight_run(images):
    plain = StepLoader(images, 6, 9, end_step=10)
    want = [plain.batch(s) for s in range(10)]
    with StepLoader(images, 6, 9, end_step=10, workers=2, prefetch=2, share=(0, None)) as par:
        got = [par.batch(s) for s in range(10)]
        assert all(same(a[0], b[0]) and same(a[1], b[1]) for a, b in zip(want, got))
        x, _ = par.batch(4)  # out of order: the workers start again at 4
        assert torch.equal(x, want[4][0]) and torch.equal(par.batch(5)[0], want[5][0])
    resumed = StepLoader(images, 6, 9, start_step=7, end_step=10, workers=1)
    assert all(torch.equal(resumed.batch(s)[0], want[s][0]) for s in range(7, 10))
    resumed.close()


def test_augmentation_is_a_function_of_seed_epoch_and_index(images):
    a, b = images.sample(3, sample_seed(1, 0, 3)), images.sample(3, sample_seed(1, 0, 3))
    assert torch.equal(a[0], b[0])
    assert not torch.equal(a[0], images.sample(3, sample_seed(1, 1, 3))[0])  # another epoch: another crop
    assert not torch.equal(a[0], images.sample(3, None)[0])
    loader = StepLoader(images, 4, 1)
    step = 5
    epoch, idx = loader.epoch_of(step), loader.indices(step)
    x, _ = loader.batch(step)
    for row, i in enumerate(idx):
        assert torch.equal(x[row], images.sample(int(i), sample_seed(1, epoch, int(i)))[0])


def test_eval_batches_cover_the_split_in_order(tmp_path):
    make_tokens(tmp_path / "tok")
    va = open_source({"kind": "token_file", "path": "tok", "seq_len": 16}, "val", tmp_path)
    batches = list(eval_batches(va, 10))
    assert sum(len(b[0]) for b in batches) == len(va) == 49 and len(batches[-1][0]) == 9
    assert torch.equal(batches[1][0][0], va.sample(10, None)[0])
    half = list(eval_batches(va, 10, share=(5, None)))
    assert torch.equal(half[0][0], batches[0][0][5:])


def test_a_corrupt_jpeg_is_skipped_and_counted_strict_names_it(tmp_path):
    make_images(tmp_path / "imgs", per_class=10)
    src = open_source(IMG, "train", tmp_path)
    i_bad = int(StepLoader(src, 4, 0).indices(2)[1])  # a sample in the middle of the epoch
    bad = src.path / src.files[i_bad]
    bad.write_bytes(bad.read_bytes()[:200])  # truncated in the middle of its data
    for workers in (0, 2):
        loader = StepLoader(src, 4, 0, workers=workers)
        for s in range(loader.steps_per_epoch):
            x, y = loader.batch(s)
            assert x.shape == (4, 3, 16, 16)  # the batch keeps its size
            if s == 2:  # the next readable sample takes its place
                assert torch.equal(x[1], src.sample(i_bad + 1, sample_seed(0, 0, i_bad))[0])
        loader.close()
        assert loader.skipped == 1 and src.files[i_bad] in loader.skipped_files[0]
    strict = StepLoader(src, 4, 0, strict=True)
    with pytest.raises(DataError, match=rf"{src.files[i_bad]}: not a readable image .*sample {i_bad}") as e:
        strict.batch(2)
    assert "\n" not in str(e.value)


# ---- bad input: one line naming the file ---------------------------------------------
def one_line(fn, match):
    with pytest.raises(DataError, match=match) as e:
        fn()
    assert "\n" not in str(e.value) and "Traceback" not in str(e.value)


def test_bad_inputs_give_one_line(tmp_path):
    one_line(lambda: open_source({"kind": "image_folder", "path": "nope"}, "train", tmp_path),
             r"nope: nothing found at this path")
    make_images(tmp_path / "imgs", per_class=2)
    (tmp_path / "imgs" / "fox").mkdir()
    one_line(lambda: open_source(IMG, "train", tmp_path), r"imgs/fox: empty class folder")
    (tmp_path / "imgs" / "fox" / "0.jpg").write_bytes(b"not a jpeg")
    src = [s for s in (open_source(IMG, "train", tmp_path), open_source(IMG, "val", tmp_path))
           if "fox/0.jpg" in s.files][0]
    one_line(lambda: src.sample(src.files.index("fox/0.jpg"), None), r"imgs/fox/0\.jpg: not a readable image")
    make_tokens(tmp_path / "tok", vocab=300)
    tok = open_source({"kind": "token_file", "path": "tok", "seq_len": 8, "vocab_size": 100}, "train", tmp_path)
    one_line(lambda: [tok.sample(i, None) for i in range(len(tok))],
             r"train\.bin: token \d+ at position \d+ is beyond the vocabulary \(100\)")
    loader = StepLoader(tok, 8, 0, workers=1)  # the same line through a worker
    one_line(lambda: [loader.batch(s) for s in range(loader.steps_per_epoch)], r"beyond the vocabulary")
    loader.close()
    make_shards(tmp_path / "sh", n_shards=2)
    one_line(lambda: open_source({"kind": "shards", "path": "sh/data-{000..002}.tar"}, "train", tmp_path),
             r"sh/data-002\.tar: missing shard")
    make_parquet(tmp_path / "t.parquet")
    one_line(lambda: open_source({"kind": "parquet", "path": "t.parquet", "inputs": ["input_ids", "mask"],
                                  "target": "label"}, "train", tmp_path), r"t\.parquet: no column 'mask'")
    (tmp_path / "odd.bin").write_bytes(b"\x01\x02\x03")
    one_line(lambda: open_source({"kind": "token_file", "path": "odd.bin", "vocab_size": 9}, "train", tmp_path),
             r"odd\.bin: 3 bytes is not a whole number")
    (tmp_path / "tok" / "meta.json").unlink()
    one_line(lambda: open_source({"kind": "token_file", "path": "tok/train.bin"}, "train", tmp_path),
             r"train\.bin: the vocabulary size is unknown")
    one_line(lambda: StepLoader(open_source(IMG, "val", tmp_path), 64, 0), r"batch_size 64 is larger")


def test_only_image_and_parquet_need_their_packages(tmp_path):
    """A node with torch and numpy only: the package imports, tokens read, images and
    Parquet fail in one line naming the package."""
    make_images(tmp_path / "imgs", per_class=2)
    make_tokens(tmp_path / "tok")
    make_parquet(tmp_path / "t.parquet")
    code = f"""
import sys
for m in ("PIL", "PIL.Image", "pyarrow", "pyarrow.parquet"):
    sys.modules[m] = None
from pathlib import Path
import engine.runtime.datasets as d
base = Path({str(tmp_path)!r})
print(len(d.open_source({{"kind": "token_file", "path": "tok", "seq_len": 8}}, "train", base)))
for s in ({IMG!r}, {{"kind": "parquet", "path": "t.parquet", "inputs": ["f1"], "target": "label"}}):
    try:
        d.open_source(s, "train", base).sample(0, None)
    except d.DataError as e:
        print(e)
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["624", "image_folder needs Pillow on this node: pip install pillow",
                                       "parquet needs pyarrow on this node: pip install pyarrow"]


def test_fingerprint_is_content_based(tmp_path):
    make_images(tmp_path / "imgs", per_class=3)
    a = fingerprint(IMG, tmp_path)
    shutil.copytree(tmp_path / "imgs", tmp_path / "copy" / "imgs", copy_function=shutil.copy)  # new mtimes, same content
    b = fingerprint({**IMG, "path": str(tmp_path / "copy" / "imgs")}, None)
    assert (a["files"], a["bytes"], a["digest"]) == (b["files"], b["bytes"], b["digest"]) and a["files"] == 9
    assert a["mtime_digest"] != b["mtime_digest"]
    f = tmp_path / "copy" / "imgs" / "cat" / "000.jpg"
    f.write_bytes(f.read_bytes()[:-1] + b"\x00")
    assert fingerprint({**IMG, "path": str(tmp_path / "copy" / "imgs")}, None)["digest"] != a["digest"]
    make_tokens(tmp_path / "tok")
    t = fingerprint({"kind": "token_file", "path": "tok"}, tmp_path)
    assert t["files"] == 3 and t["bytes"] == 5000 * 2 + 800 * 2 + (tmp_path / "tok" / "meta.json").stat().st_size


def test_the_random_resized_box_lies_inside_every_image():
    """torchvision's RandomResizedCrop.get_params: ten draws, then the centre crop at the
    nearest ratio in [3/4, 4/3] (a 17x50 text line: its whole width, 23 px of its height);
    any image of at least one pixel, any draws, gives a box inside it."""
    import random

    from engine.runtime.datasets.images import random_resized_box

    never = lambda: 0.999999  # noqa: E731 - the largest area at the widest ratio: no try fits a narrow image
    assert random_resized_box(17, 50, (0.08, 1.0), never) == (0, 13, 17, 36)
    assert random_resized_box(50, 17, (0.08, 1.0), never) == (13, 0, 36, 17)
    assert random_resized_box(1, 300, (0.08, 1.0), never) == (0, 149, 1, 150)
    assert random_resized_box(40, 40, (1.0, 1.0), never) == (0, 0, 40, 40)
    rng = random.Random(0)
    for _ in range(5000):
        W, H = rng.choice([1, 2, 3, 17, 50, 300, 4000]), rng.choice([1, 2, 3, 17, 50, 300, 4000])
        left, top, right, bottom = random_resized_box(W, H, (rng.uniform(0.01, 1.0), 1.0), rng.random)
        assert 0 <= left < right <= W and 0 <= top < bottom <= H, (W, H, (left, top, right, bottom))
