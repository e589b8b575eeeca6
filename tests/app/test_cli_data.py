"""`layerflow data inspect | pack | use` as a user runs them (app.cli.main in this process,
the data command registered from app/cli/data_cmds.py), on generated data: what is printed,
what is written, and one line for each bad input."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from app import cli
from app.cli import data_cmds as cli_data
from engine.project import load_project, save_project

from tests.engine.runtime.test_datasets import make_images, make_npz, make_parquet, make_tokens

EX = Path(__file__).resolve().parents[2] / "resources" / "examples"


@pytest.fixture
def run(monkeypatch, capsys):
    """run(*argv) -> (exit code, stdout, stderr), through app.cli.main with `data` registered
    (once app/cli/__init__.py lists cli_data itself, it is not registered twice)."""
    build = cli.build_parser

    def with_data():
        parser = build()
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        if "data" not in sub.choices:
            cli_data.register(sub)
        return parser

    monkeypatch.setattr(cli, "build_parser", with_data)

    def go(*argv):
        capsys.readouterr()
        rc = cli.main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return rc, out, err

    return go


def one_line_error(rc, err, *needles):
    assert rc == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err


QUICK = ("--seconds", "0.1")


# ---- inspect ---------------------------------------------------------------------------
def test_inspect_an_image_folder_shows_counts_shapes_histogram_and_writes_previews(run, tmp_path):
    make_images(tmp_path / "imgs", classes=("cat", "dog", "eel"), per_class=6)
    rc, out, err = run("data", "inspect", tmp_path / "imgs", "--image-size", "16", "--samples", "3",
                       "--preview-dir", tmp_path / "prev", *QUICK)
    assert rc == 0, err
    assert out.startswith(f"image_folder: {tmp_path / 'imgs'}")
    assert "task: classification" in out and "samples: 16 train, 2 val" in out
    assert "x (one sample): float32 [3, 16, 16]" in out and "y (one sample): int64 []" in out
    bars = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith("    ") and "#" in ln and "%" in ln}
    assert set(bars) == {"cat", "dog", "eel"}
    counts = {k: int(v.split()[2]) for k, v in bars.items()}
    assert sum(counts.values()) == 16
    top = max(counts, key=counts.get)
    assert bars[top].count("#") == 30  # the largest class fills the bar
    pngs = sorted(p.name for p in (tmp_path / "prev").iterdir())
    assert len(pngs) == 6 and sum(n.endswith("-augmented.png") for n in pngs) == 3
    with Image.open(tmp_path / "prev" / pngs[0]) as im:
        assert im.size == (16, 16) and im.mode == "RGB"
    assert f"image previews: 6 PNGs in {tmp_path / 'prev'}" in out
    assert "loader:" in out and "samples/s" in out
    assert float(out.split("loader: ")[1].split(" samples/s")[0].replace(",", "")) > 0


def test_inspect_json(run, tmp_path):
    make_images(tmp_path / "imgs", per_class=4)
    rc, out, err = run("data", "inspect", tmp_path / "imgs", "--image-size", "8", "--json", "--samples", "2", *QUICK)
    assert rc == 0, err
    d = json.loads(out)
    assert d["kind"] == "image_folder" and d["classes"] == ["cat", "dog", "eel"] and d["n_classes"] == 3
    assert d["samples"]["train"] + d["samples"]["val"] == 12 and sum(d["histogram"]["counts"]) == d["samples"]["train"]
    assert d["spec"]["x"] == {"shape": [3, 8, 8], "dtype": "float32"}
    assert [e["x_shape"] for e in d["examples"]] == [[3, 8, 8]] * 2 and d["examples"][0]["class"] == "cat"
    assert d["throughput"]["samples_per_s"] > 0 and d["settings"]["image_size"] == 8 and d["unreadable"] == []


def test_pack_text_then_inspect_shows_the_decoded_text(run, tmp_path):
    text = "The quick brown fox jumps over the lazy dog.\n" * 40
    (tmp_path / "a.txt").write_text(text)
    rc, out, err = run("data", "pack", tmp_path / "a.txt", tmp_path / "tok")
    assert rc == 0, err
    n = len(text.encode())
    assert f"train.bin ({n - round(n * 0.1):,} tokens)" in out and "vocabulary 256 (uint16, byte)" in out
    assert f"data use PROJECT {tmp_path / 'tok'}" in out
    assert sorted(p.name for p in (tmp_path / "tok").iterdir()) == ["meta.json", "train.bin", "val.bin"]
    rc, out, err = run("data", "inspect", tmp_path / "tok", "--seq-len", "20", "--samples", "1", *QUICK)
    assert rc == 0, err
    assert "token_file:" in out and "task: language_model" in out and "x (one sample): int64 [20]" in out
    assert "vocabulary: 256 (uint16)" in out
    assert repr(text[:21]) in out  # window 0 (seq_len + 1 tokens) decoded


def test_pack_reports_progress_on_stderr_when_it_takes_long(run, tmp_path, monkeypatch):
    (tmp_path / "a.txt").write_text("x" * 5000 + "\n")
    monkeypatch.setattr("engine.data.pack.CHUNK", 500)  # ten chunks
    clock = iter(range(0, 10_000, 3))  # every look at the clock: 3 s later
    monkeypatch.setattr(cli_data.time, "monotonic", lambda: next(clock))
    rc, _, err = run("data", "pack", tmp_path / "a.txt", tmp_path / "tok")
    assert rc == 0, err
    lines = err.splitlines()
    assert len(lines) >= 3 and all(ln.startswith(f"packing {tmp_path / 'a.txt'}: ") for ln in lines), err
    assert lines[-1].endswith("100% (4.9 KiB of 4.9 KiB)")
    rc, _, err = run("data", "pack", tmp_path / "a.txt", tmp_path / "tok2", "--quiet")
    assert rc == 0 and err == ""


def test_pack_images_to_shards_and_arrays_to_npy(run, tmp_path):
    make_images(tmp_path / "imgs", per_class=5)
    rc, out, err = run("data", "pack", tmp_path / "imgs", tmp_path / "sh", "--shards", "4")
    assert rc == 0, err
    assert sorted(p.name for p in (tmp_path / "sh").glob("*.tar")) == [f"data-00000{k}.tar" for k in range(4)]
    assert "4 tar shard(s) of up to 4 samples" in out and "3 classes" in out
    rc, out, err = run("data", "inspect", tmp_path / "sh", "--image-size", "8", "--json", *QUICK)
    assert rc == 0, err
    d = json.loads(out)
    assert d["kind"] == "shards" and d["classes"] == ["cat", "dog", "eel"]
    assert d["samples"]["train"] + d["samples"]["val"] == 15

    make_npz(tmp_path / "d.npz", n=40, compressed=True)
    rc, out, err = run("data", "pack", tmp_path / "d.npz", tmp_path / "arr")
    assert rc == 0, err
    assert "x_train.npy [40, 5]" in out and np.load(tmp_path / "arr" / "y_val.npy").shape == (30,)
    (tmp_path / "t.csv").write_text("a,b,kind\n" + "".join(f"{i},{i * 2},{'odd' if i % 2 else 'even'}\n"
                                                          for i in range(30)))
    rc, out, err = run("data", "pack", tmp_path / "t.csv", tmp_path / "csv", "--target", "kind")
    assert rc == 0, err
    rc, out, err = run("data", "inspect", tmp_path / "csv", *QUICK)
    assert rc == 0, err
    assert "array:" in out and "x (one sample): float32 [2]" in out
    assert "classes: 2" in out and "even  " in out and "odd  " in out


def test_inspect_parquet_guesses_its_columns_and_is_told_others(run, tmp_path):
    make_parquet(tmp_path / "t.parquet", n=60)
    rc, out, err = run("data", "inspect", tmp_path / "t.parquet", "--seq-len", "8", "--json", *QUICK)
    assert rc == 0, err
    d = json.loads(out)
    assert d["settings"]["inputs"] == ["input_ids", "attention_mask"] and d["settings"]["target"] == "label"
    assert d["spec"]["x"] == {"input_ids": {"shape": [8], "dtype": "int64"},
                              "attention_mask": {"shape": [8], "dtype": "int64"}}
    assert d["n_classes"] == 5
    rc, out, err = run("data", "inspect", tmp_path / "t.parquet", "--inputs", "f1", "--target", "label", *QUICK)
    assert rc == 0, err
    assert "x (one sample): float32 []" in out or "x (one sample): float32 [1]" in out
    # lists of different lengths without --seq-len: one line saying what to set
    rc, out, err = run("data", "inspect", tmp_path / "t.parquet", *QUICK)
    one_line_error(rc, err, "t.parquet: column 'input_ids' holds sequences of 1 to 7 values", "set seq_len")


# ---- use -------------------------------------------------------------------------------
def test_use_sets_the_dataset_names_the_mismatched_node_and_fits_the_input(run, tmp_path):
    make_images(tmp_path / "imgs", per_class=6)
    proj = tmp_path / "p.lflow"
    proj.write_text((EX / "mlp_digits.lflow").read_text())  # Input [64], head: Linear(64 -> 10)
    before = load_project(proj)
    rc, out, err = run("data", "use", proj, tmp_path / "imgs", "--image-size", "8")
    assert rc == 0, err
    p = load_project(proj)
    assert p.training.dataset.kind == "image_folder" and p.training.dataset.path == "imgs"  # relative: inside
    assert p.training.dataset.image_size == 8
    assert p.graph.nodes["x"].params["shape"] == [64]  # not fitted
    warnings = err.splitlines()
    assert "warning: node 'x' (Input): shape is [64] but the data set's samples are [3, 8, 8]; set the Input's " \
           "shape to [3, 8, 8]" in warnings
    assert "warning: node 'head' (Linear): outputs 10 values per sample but the data set has 3 classes" in warnings
    assert "training.dataset: image_folder at imgs" in out and "3 classes" in out
    assert p.training.steps == before.training.steps and list(p.graph.nodes) == list(before.graph.nodes)
    assert [f.name for f in tmp_path.iterdir() if f.name.startswith(".")] == []  # saved atomically: no temp left

    rc, out, err = run("data", "use", proj, tmp_path / "imgs", "--fit")
    assert rc == 0, err
    p = load_project(proj)
    assert p.graph.nodes["x"].params["shape"] == [3, 8, 8]  # image_size kept from the project's settings
    assert "fitted node 'x' (Input): shape [64] -> [3, 8, 8], dtype float32 -> float32" in out
    assert [ln for ln in err.splitlines() if "node 'x'" in ln] == []
    assert "warning: node 'head' (Linear): outputs 10 values per sample but the data set has 3 classes" in err


def test_use_a_token_file_follows_the_inputs_length_and_fit_sets_the_dtype(run, tmp_path):
    make_tokens(tmp_path / "tok", vocab=256)
    proj = tmp_path / "p.lflow"
    proj.write_text((EX / "mlp_digits.lflow").read_text())
    rc, out, err = run("data", "use", proj, tmp_path / "tok", "--fit")
    assert rc == 0, err
    p = load_project(proj)
    assert p.training.dataset.kind == "token_file" and p.training.dataset.seq_len == 64  # from the Input's [64]
    assert "seq_len 64 from node 'x' (Input)" in out
    assert p.graph.nodes["x"].params == {**p.graph.nodes["x"].params, "shape": [64], "dtype": "int64"}
    assert "fitted node 'x' (Input): shape [64] -> [64], dtype float32 -> int64" in out


def test_use_data_outside_the_project_folder_is_stored_absolute_and_consented(run, tmp_path):
    make_images(tmp_path / "data" / "imgs", per_class=3)
    (tmp_path / "proj").mkdir()
    proj = tmp_path / "proj" / "p.lflow"
    proj.write_text((EX / "cnn_digits.lflow").read_text())
    rc, out, err = run("data", "use", proj, tmp_path / "data" / "imgs")
    assert rc == 0, err
    p = load_project(proj)
    assert p.training.dataset.path == str((tmp_path / "data" / "imgs").resolve())
    assert "recorded your consent" in out
    from engine import trust
    from engine.data.describe import source_settings

    with trust.as_consented(p):
        assert source_settings(p)["path"] == p.training.dataset.path  # the builder may read it now


# ---- bad input: one line naming the file (and sample or row) ---------------------------
def test_bad_inputs_give_one_line(run, tmp_path):
    rc, _, err = run("data", "inspect", tmp_path / "nope", *QUICK)
    one_line_error(rc, err, f"{tmp_path / 'nope'}: nothing found at this path")

    make_images(tmp_path / "imgs", per_class=2)
    (tmp_path / "imgs" / "fox").mkdir()
    rc, _, err = run("data", "inspect", tmp_path / "imgs", "--image-size", "8", *QUICK)
    one_line_error(rc, err, "imgs/fox: empty class folder")
    rc, _, err = run("data", "pack", tmp_path / "imgs", tmp_path / "sh")
    one_line_error(rc, err, "imgs/fox: empty class folder")
    assert not (tmp_path / "sh").exists() or not list((tmp_path / "sh").iterdir())

    make_images(tmp_path / "split", per_class=2, split_dirs=True)  # train/ and val/: the bad one is in train
    (tmp_path / "split" / "train" / "dog" / "001.jpg").write_bytes(b"not a jpeg at all")
    rc, out, err = run("data", "inspect", tmp_path / "split", "--image-size", "8", "--samples", "6", *QUICK)
    assert rc == 0, err  # listed and passed over, as training does
    bad = [ln for ln in out.splitlines() if "unreadable" in ln]
    assert len(bad) == 1 and "train/dog/001.jpg: not a readable image" in bad[0] and "(sample 3)" in bad[0], out
    rc, _, err = run("data", "inspect", tmp_path / "split", "--image-size", "8", "--samples", "6", "--strict", *QUICK)
    one_line_error(rc, err, "train/dog/001.jpg: not a readable image", "sample 3; strict mode")

    make_parquet(tmp_path / "t.parquet")
    rc, _, err = run("data", "inspect", tmp_path / "t.parquet", "--inputs", "input_ids,mask", "--target", "label",
                     *QUICK)
    one_line_error(rc, err, "t.parquet: no column 'mask'")

    (tmp_path / "bad.csv").write_text("a,b,y\n1,2,0\n3,oops,1\n")
    rc, _, err = run("data", "pack", tmp_path / "bad.csv", tmp_path / "arr")
    one_line_error(rc, err, "bad.csv: row 3 has a value that is not a number")

    rc, _, err = run("data", "inspect", tmp_path / "imgs", "--image-size", "0", *QUICK)
    one_line_error(rc, err, "training.dataset: image_size: must be greater than or equal to 1")

    rc, _, err = run("data", "inspect", tmp_path / "bad.csv", *QUICK)
    one_line_error(rc, err, "bad.csv: not a data set read in place", "data pack")

    proj = tmp_path / "p.lflow"
    proj.write_text((EX / "mlp_digits.lflow").read_text())
    saved = proj.read_bytes()
    rc, _, err = run("data", "use", proj, tmp_path / "t.parquet", "--inputs", "nope", "--target", "label")
    one_line_error(rc, err, "t.parquet: no column 'nope'")
    assert proj.read_bytes() == saved  # nothing written
    rc, _, err = run("data", "use", tmp_path / "missing.lflow", tmp_path / "t.parquet")
    one_line_error(rc, err, "missing.lflow")


def test_use_data_outside_asks_for_consent_when_the_project_has_other_untrusted_files(run, tmp_path):
    from engine.project import save_project

    make_images(tmp_path / "data" / "imgs", per_class=3)
    (tmp_path / "proj").mkdir()
    p = load_project(EX / "cnn_digits.lflow")
    p.weights = str(tmp_path / "elsewhere" / "w.pt")  # a file outside the folder nobody consented to
    save_project(p, tmp_path / "proj" / "p.lflow")
    rc, out, err = run("data", "use", tmp_path / "proj" / "p.lflow", tmp_path / "data" / "imgs")
    assert rc == 0, err
    assert "recorded your consent" not in out
    assert f"note: {(tmp_path / 'data' / 'imgs').resolve()} is outside the project's folder; `layerflow trust " in err


class _WordTokenizer:
    """The surface of tokenizers.Tokenizer that packing and inspecting use: one id per word
    of the file's list (tokenizers itself is not needed to test the command)."""

    def __init__(self, words):
        self.words = words

    @classmethod
    def from_file(cls, path):
        return cls(json.loads(Path(path).read_text())["words"])

    def get_vocab_size(self):
        return len(self.words)

    def encode(self, text, add_special_tokens=True):
        import types

        return types.SimpleNamespace(ids=[self.words.index(w) for w in text.split()])

    def decode(self, ids):
        return " ".join(self.words[i] for i in ids)


def test_pack_with_a_tokenizer_file_and_inspect_decodes_through_it(run, tmp_path, monkeypatch):
    import types

    monkeypatch.setitem(sys.modules, "tokenizers", types.SimpleNamespace(Tokenizer=_WordTokenizer))
    words = ["the", "cat", "sat", "on", "mat", "a", "dog"]
    (tmp_path / "tokenizer.json").write_text(json.dumps({"words": words}))
    (tmp_path / "t.txt").write_text("the cat sat on the mat\na dog sat on a cat\n" * 20)
    rc, out, err = run("data", "pack", tmp_path / "t.txt", tmp_path / "tok", "--tokenizer", tmp_path / "tokenizer.json")
    assert rc == 0, err
    assert "vocabulary 7 (uint16, tokenizer.json)" in out and (tmp_path / "tok" / "tokenizer.json").is_file()
    rc, out, err = run("data", "inspect", tmp_path / "tok", "--seq-len", "5", "--samples", "1", *QUICK)
    assert rc == 0, err
    assert "vocabulary: 7 (uint16)" in out and "'the cat sat on the mat'" in out
    rc, _, err = run("data", "pack", tmp_path / "t.txt", tmp_path / "x", "--tokenizer", tmp_path / "nope.json")
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1 and "nope.json" in err, err


def test_a_real_process_prints_one_line_and_exits_2(tmp_path):
    """The command in a process of its own, as `layerflow data ...` runs once app/cli/__init__.py lists
    cli_data: exit codes and stderr as the user sees them."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    code = ("import sys, app.cli as c, app.cli.data_cmds as d\n"
            "c.COMMAND_MODULES.append(d) if d not in c.COMMAND_MODULES else None\n"
            "raise SystemExit(c.main(sys.argv[1:]))\n")

    def cli(*args):
        return subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=root, capture_output=True, check=False,
                              text=True, timeout=300)

    make_images(tmp_path / "imgs", per_class=3)
    (tmp_path / "imgs" / "fox").mkdir()
    r = cli("data", "inspect", tmp_path / "imgs", "--seconds", "0.1")
    assert r.returncode == 2 and r.stderr == f"error: {tmp_path / 'imgs' / 'fox'}: empty class folder (no .jpg, " \
                                             ".png or .webp images)\n", r.stderr
    (tmp_path / "imgs" / "fox").rmdir()
    r = cli("data", "inspect", tmp_path / "imgs", "--image-size", "8", "--seconds", "0.1")
    assert r.returncode == 0 and "classes: 3" in r.stdout and r.stderr == "", r.stderr


# ---- images users really have (issue 61) ------------------------------------------------
MODES = ("1", "L", "P", "RGB", "RGBA", "I;16", "CMYK")
SHAPES = ((17, 50), (50, 17), (1, 300), (300, 1), (2, 1000), (1000, 3), (1, 1), (9, 9))  # (width, height)


def make_odd_images(root: Path) -> int:
    """Two classes of images in every PIL mode at extreme aspect ratios (a scanned text
    line, a one-pixel column), written with Pillow; CMYK as JPEG (PNG holds no CMYK)."""
    rng = np.random.default_rng(5)
    n = 0
    for c in ("line", "word"):
        (root / c).mkdir(parents=True)
        for mode in MODES:
            for w, h in SHAPES:
                a = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
                im = Image.fromarray(a).convert(mode if mode != "I;16" else "L")
                if mode == "I;16":
                    im = Image.fromarray(rng.integers(0, 2 ** 16, (h, w), dtype=np.uint16))
                    assert im.mode == "I;16"
                im.save(root / c / f"{mode.replace(';', '_')}-{w}x{h}.{'jpg' if mode == 'CMYK' else 'png'}")
                n += 1
    return n


def test_narrow_images_in_every_mode_inspect_and_train(run, tmp_path):
    """A 17x50 image (and 1x300, 300x1, ...) in modes 1, L, P, RGB, RGBA, I;16, CMYK: the
    random resized crop's fallback box stays inside the image (torchvision's: the centre
    crop at the nearest allowed ratio), so no sample ends the run or the inspection."""
    from engine.runtime.datasets import open_source

    n = make_odd_images(tmp_path / "imgs")
    for channels in (1, 3):
        src = open_source({"kind": "image_folder", "path": str(tmp_path / "imgs"), "image_size": 8,
                           "channels": channels, "val_fraction": 0.1}, "train", None)
        for i in range(len(src)):
            for seed in (None, 1, 2, 3, 4, 5, 6, 7):  # the validation crop, and augmented draws
                x, _ = src.sample(i, seed)
                assert tuple(x.shape) == (channels, 8, 8) and bool(x.isfinite().all()), src.where(i)
    rc, out, err = run("data", "inspect", tmp_path / "imgs", "--image-size", "8", "--samples", "24", *QUICK)
    assert rc == 0, err
    assert "unreadable" not in out and f"samples: {n - round(n * 0.1)} train" in out, out
    proj = tmp_path / "p.lflow"
    proj.write_text((EX / "cnn_digits.lflow").read_text())
    rc, out, err = run("data", "use", proj, tmp_path / "imgs", "--fit")
    assert rc == 0, err
    p = load_project(proj)
    p.graph.set_param("head", "out_features", 2)  # two classes
    save_project(p)
    rc, out, err = run("train", proj, "--steps", "3", "--out", tmp_path / "run")
    assert rc == 0, err
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["state"] == "succeeded" and status["step"] == 3, status
