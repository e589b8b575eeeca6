"""Data sets from Python: look at one, pack one, point a project at one.

    import layerflow as lf

    report = lf.inspect("photos/")                   # kind guessed from the names: image_folder
    print(report)                                    # samples, shapes, classes, loader samples/s
    report.save_previews("previews/")                # the example images as PNGs (plain, augmented)

    packed = lf.pack(["corpus.txt"], "tokens/")      # text -> train.bin, val.bin, meta.json
    p = lf.Project.load("gpt.lflow")
    used = p.use_data("tokens/", seq_len=128)        # training.dataset; used.mismatches names nodes
    p.save()

The work is the engine's (engine/data/inspection.py, engine/data/pack.py, engine/data/describe.py);
this module picks the kind, checks the settings as the project file's are, and raises
`lf.DataError` (a LayerflowError) in one line naming the file, and sample or row, at fault.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from engine.errors import LayerflowError
from engine.files import real_path
from engine.runtime.datasets import DataError as _RuntimeDataError
from engine.runtime.datasets.base import check_found

Progress = Callable[[int, int], None]


class DataError(LayerflowError, _RuntimeDataError):
    """A data set that cannot be read, packed or used, in one line naming the file (and
    the sample or row) at fault. Also the runtime's DataError (a ValueError)."""


def _models() -> dict:
    from engine.data.sources import ArrayFile, ImageFolder, Parquet, Shards, TokenFile

    return {"image_folder": ImageFolder, "token_file": TokenFile, "parquet": Parquet, "array": ArrayFile,
            "shards": Shards}


KINDS = ("image_folder", "token_file", "parquet", "array", "shards")


def _one_line(exc: BaseException) -> str:
    lines = [s.strip() for s in str(exc).strip().splitlines() if s.strip()]
    return "; ".join(lines) or type(exc).__name__


def _os_error(exc: OSError, where: str | os.PathLike) -> DataError:
    from engine.files import os_error_text

    return DataError(f"{exc.filename or where}: {os_error_text(exc)}")


def settings(path: str | os.PathLike, kind: str | None = None, **options: Any) -> dict:
    """training.dataset's settings for the data set at `path` (kind guessed from its file
    names when not given; a Parquet set's columns from its schema when not given), checked
    as the project file's are. The path stays as given."""
    from engine.data.inspection import guess_columns, guess_kind

    p = Path(os.path.expanduser(str(path)))
    try:
        kind = kind or guess_kind(p)
    except _RuntimeDataError as e:
        raise DataError(_one_line(e)) from None
    if kind not in KINDS:
        raise DataError(f"kind {kind!r} is not one of {', '.join(KINDS)}")
    values = {"kind": kind, "path": str(p), **{k: v for k, v in options.items() if v is not None}}
    if kind == "parquet" and "inputs" not in values:
        try:
            values = {**guess_columns(values), **values}
        except _RuntimeDataError as e:
            raise DataError(_one_line(e)) from None
        if "inputs" not in values:
            raise DataError(f"{p}: say which columns are the inputs and which the target (inputs=[...], "
                            f"target=...; on the command line --inputs A,B --target C)")
    return _checked(values)


def _checked(values: dict) -> dict:
    from engine.project import _format_validation

    try:
        return _models()[values["kind"]].model_validate(values).model_dump(mode="json")
    except ValidationError as exc:
        raise DataError(_one_line(_format_validation("training.dataset", exc))) from None


# ----- inspect ----------------------------------------------------------------------------
@dataclass
class DataReport:
    """What a data set holds (engine/data/inspection.py's report): `str(report)` is what
    `layerflow data inspect` prints, `to_dict()` its --json. `info` keeps the example
    tensors as numpy arrays (info["examples"][k]["x"], ["image"], ["image_augmented"])."""

    info: dict
    settings: dict
    previews: list[Path] = field(default_factory=list)

    @property
    def samples(self) -> dict:
        return self.info["samples"]

    @property
    def classes(self) -> list[str] | None:
        n = self.info.get("n_classes")
        if self.info.get("vocab_size") is not None or not n:
            return None
        return self.info.get("classes") or [str(c) for c in range(n)]

    @property
    def samples_per_s(self) -> float:
        return self.info["throughput"]["samples_per_s"]

    @property
    def unreadable(self) -> list[str]:
        return list(self.info.get("unreadable") or [])

    def save_previews(self, folder: str | os.PathLike) -> list[Path]:
        """Each example image as the model sees it in validation (sample-NNNNNN.png) and
        augmented as in training (sample-NNNNNN-augmented.png); [] for data that is not
        images. Written under a temporary name, then renamed."""
        from PIL import Image

        out = Path(folder)
        written = []
        for ex in self.info["examples"]:
            for key, suffix in (("image", ""), ("image_augmented", "-augmented")):
                a = ex.get(key)
                if a is None:
                    continue
                if not written:
                    out.mkdir(parents=True, exist_ok=True)
                final = out / f"sample-{ex['index']:06d}{suffix}.png"
                tmp = out / f".{final.name}.tmp-{os.getpid()}"
                try:
                    Image.fromarray(a[..., 0] if a.shape[-1] == 1 else a).save(tmp, format="PNG")
                    os.replace(tmp, final)
                except OSError as e:
                    tmp.unlink(missing_ok=True)
                    raise _os_error(e, final) from None
                written.append(final)
        self.previews = written
        return written

    def to_dict(self) -> dict:
        """The report as JSON values (example tensors as their shapes; labels as numbers)."""
        info = self.info
        keep = ("kind", "path", "task", "samples", "spec", "n_classes", "classes", "histogram", "vocab_size",
                "seq_len", "dtype", "tokens", "text", "throughput", "unreadable")
        d = {k: info[k] for k in keep if k in info}
        d["settings"] = self.settings
        d["examples"] = [_example_json(ex, self.classes) for ex in info["examples"]]
        d["previews"] = [str(p) for p in self.previews]
        return d

    def __str__(self) -> str:
        info = self.info
        s = info["samples"]
        lines = [f"{info['kind']}: {info['path']}", f"  task: {info['task']}",
                 f"  samples: {s['train']:,} train, " + (f"{s['val']:,} val" if isinstance(s["val"], int)
                                                         else f"val {s['val']}")]
        lines += _spec_lines(info["spec"])
        if info.get("vocab_size") is not None:
            tok = info.get("tokens") or {}
            lines.append(f"  vocabulary: {info['vocab_size']:,} ({info['dtype']}); tokens: "
                         + ", ".join(f"{v:,} {k}" for k, v in tok.items() if v is not None)
                         + f"; windows of seq_len {info['seq_len']}")
        elif self.classes:
            lines += _histogram_lines(self.classes, info.get("histogram"))
        if info["examples"]:
            lines.append("  examples:")
            for ex in info["examples"]:
                lines.append("    " + _example_text(ex, self.classes))
        if self.previews:
            lines.append(f"  image previews: {len(self.previews)} PNGs in {self.previews[0].parent} "
                         "(sample-N.png as validation sees it, sample-N-augmented.png as training does)")
        elif any(ex.get("image") is not None for ex in info["examples"]):
            lines.append("  image previews: pass --preview-dir DIR to write them as PNGs")
        for bad in self.unreadable:
            lines.append(f"  unreadable (skipped in training; strict mode stops): {bad}")
        tp = info["throughput"]
        lines.append(f"  loader: {tp['samples_per_s']:,} samples/s ({tp['workers']} workers, batch "
                     f"{tp['batch_size']}), first batch {tp['first_batch_s']} s")
        return "\n".join(lines)


def _spec_text(spec: dict) -> str:
    return f"{spec['dtype']} {list(spec['shape'])}"


def _spec_lines(spec: dict) -> list[str]:
    x = spec["x"]
    if "shape" in x:
        xs = _spec_text(x)
    else:
        xs = ", ".join(f"{k} {_spec_text(v)}" for k, v in x.items())
    return [f"  x (one sample): {xs}", f"  y (one sample): {_spec_text(spec['y'])}"]


def _histogram_lines(names: list[str], hist: dict | None, width: int = 30, most: int = 30) -> list[str]:
    head = f"  classes: {len(names)}"
    if not hist:
        return [head + ": " + ", ".join(names[:most]) + (" ..." if len(names) > most else "")]
    counts = hist["counts"]
    total = sum(counts) or 1
    head += f" (labels of {'the first ' if hist['sampled'] else ''}{hist['rows']:,} samples)"
    lines = [head]
    top = max(counts) or 1
    shown = sorted(range(len(counts)), key=lambda c: -counts[c])[:most] if len(counts) > most else range(len(counts))
    pad = max(len(names[c]) if c < len(names) else len(str(c)) for c in shown)
    for c in shown:
        name = names[c] if c < len(names) else str(c)
        bar = "#" * max(1 if counts[c] else 0, round(width * counts[c] / top))
        lines.append(f"    {name.ljust(pad)}  {bar.ljust(width)}  {counts[c]:,} ({100 * counts[c] / total:.1f}%)")
    if len(counts) > most:
        lines.append(f"    ... {len(counts) - most} more classes")
    return lines


def _label(y: np.ndarray, classes: list[str] | None):
    if y.ndim == 0:
        v = y.item()
        return classes[v] if classes and isinstance(v, int) and 0 <= v < len(classes) else v
    return y.tolist() if y.size <= 16 else f"{y.dtype} {list(y.shape)}"


def _example_text(ex: dict, classes: list[str] | None) -> str:
    where = ex["where"]
    if ex.get("text") is not None:
        text = ex["text"]
        return f"#{ex['index']} {where}: {text[:120]!r}" + (" ..." if len(text) > 120 else "")
    y = ex["y"]
    what = "class" if classes and y.ndim == 0 else "y"
    return f"#{ex['index']} {where}: {what} {_label(y, classes)}"


def _example_json(ex: dict, classes: list[str] | None) -> dict:
    x = ex["x"]
    d = {"index": ex["index"], "where": ex["where"],
         "x_shape": {k: list(v.shape) for k, v in x.items()} if isinstance(x, dict) else list(x.shape)}
    y = ex["y"]
    d["y"] = y.item() if y.ndim == 0 else (y.tolist() if y.size <= 16 else None)
    if classes and y.ndim == 0 and 0 <= int(y.item()) < len(classes):
        d["class"] = classes[int(y.item())]
    if ex.get("text") is not None:
        d["text"] = ex["text"]
    return d


def inspect(path: str | os.PathLike, kind: str | None = None, *, samples: int = 4, seconds: float = 1.5,
            batch_size: int = 32, workers: int = 0, strict: bool = False,
            preview_dir: str | os.PathLike | None = None, **options: Any) -> DataReport:
    """Look at a data set: samples per split, one sample's shapes and dtypes, the task,
    classes and their histogram (or the vocabulary and decoded token text), `samples`
    examples spread over the training split (images plain and augmented), and the step
    loader's samples/s over about `seconds`. `options` are training.dataset's settings of
    that kind (image_size=, seq_len=, inputs=, target=, ...). A corrupt sample is listed in
    `report.unreadable` and passed over, as training does; strict=True raises it.
    With preview_dir, the example images are written there as PNGs."""
    from engine.data.inspection import inspect_source

    if samples < 0:
        raise DataError(f"samples: {samples} must be 0 or more")
    if seconds <= 0:
        raise DataError(f"seconds: {seconds} must be more than 0")
    if batch_size < 1 or workers < 0:
        raise DataError(f"batch_size must be at least 1 and workers 0 or more, not {batch_size} and {workers}")
    s = settings(path, kind, **options)
    source = {**s, "path": str(Path(s["path"]).resolve()) if "{" not in Path(s["path"]).name else s["path"]}
    try:
        info = inspect_source(source, examples=samples, seconds=seconds, batch_size=batch_size, workers=workers,
                              strict=strict)
    except _RuntimeDataError as e:
        raise DataError(_one_line(e)) from None
    except OSError as e:
        raise _os_error(e, path) from None
    report = DataReport(info, s)
    if preview_dir is not None:
        report.save_previews(preview_dir)
    return report


# ----- pack -------------------------------------------------------------------------------
@dataclass
class Packed:
    """What `pack` wrote: the kind that reads it in place, its folder, and the packer's
    summary (meta.json's content for tokens; classes and counts for shards; array shapes).
    `dataset` is training.dataset's settings for it."""

    kind: str
    path: Path
    meta: dict
    what: str = ""

    @property
    def dataset(self) -> dict:
        return {"kind": self.kind, "path": str(self.path)}

    def __str__(self) -> str:
        m = self.meta
        if self.kind == "token_file":
            tok = m["tokens"]
            body = (f"train.bin ({tok['train']:,} tokens), val.bin ({tok['val']:,} tokens), meta.json: "
                    f"vocabulary {m['vocab_size']:,} ({m['dtype']}, {m['tokenizer']})")
        elif self.kind == "shards":
            n = ", ".join(f"{v:,} {k}" for k, v in m["samples"].items()) if "data" not in m["samples"] else \
                f"{m['samples']['data']:,} samples, split by val_fraction when read"
            shards = sorted(p.name for p in self.path.glob("*.tar"))
            body = (f"{len(shards)} tar shard(s) of up to {m['shard_size']:,} samples ({n}), classes.json: "
                    f"{len(m['classes'])} classes")
        else:
            body = ", ".join(f"{k}.npy {v}" for k, v in m.items())
        return f"wrote {self.path}: {body}"


def pack(sources: str | os.PathLike | Iterable[str | os.PathLike], out: str | os.PathLike, *,
         tokenizer: str | os.PathLike | None = None, shard_size: int = 1000, val_fraction: float = 0.1,
         target: str | int = -1, header: bool = True, as_kind: str | None = None,
         progress: Progress | None = None) -> Packed:
    """Pack data into a form read in place, into the folder `out`:
      - text files (or a folder of .txt files) -> train.bin, val.bin, meta.json
        (byte-level, or `tokenizer`: a tokenizers tokenizer.json); the last val_fraction
        of the tokens is validation;
      - an image folder (class folders, or train/ and val/ of them) -> tar shards of
        shard_size samples and classes.json;
      - an .npz or a .csv (target: the label column, by name or index) -> .npy files.
    as_kind ("token_file", "shards", "array") says which where the names do not.
    progress(done, total) follows the work (bytes, or images for shards). Every file is
    written under a temporary name, then renamed: an interrupted pack leaves no half file."""
    from engine.data import pack as datapack

    srcs = [Path(os.path.expanduser(str(s))) for s in
            ([sources] if isinstance(sources, (str, os.PathLike)) else list(sources))]
    if not srcs:
        raise DataError("pack: no input given")
    for s in srcs:
        check_found(s, DataError)
    kind = as_kind or pack_kind(srcs)
    if kind not in ("token_file", "shards", "array"):
        raise DataError(f"pack makes token_file, shards or array data, not {kind!r}")
    if tokenizer is not None and kind != "token_file":
        raise DataError(f"tokenizer: only text is tokenized; {srcs[0]} packs to {kind}")
    if kind != "token_file" and len(srcs) != 1:
        raise DataError(f"pack: {kind} takes one input, not {len(srcs)}")
    out = Path(os.path.expanduser(str(out)))
    if out.exists() and not out.is_dir():
        raise DataError(f"{out}: exists and is not a folder")
    try:
        if kind == "token_file":
            files = [f for s in srcs for f in (_text_files(s) if s.is_dir() else [s])]
            meta = datapack.pack_text(files, out, tokenizer=Path(tokenizer) if tokenizer else None,
                                      val_fraction=val_fraction, progress=progress)
        elif kind == "shards":
            meta = datapack.pack_shards(srcs[0], out, shard_size=shard_size, progress=progress)
        else:
            meta = datapack.pack_array(srcs[0], out, target=target, header=header, progress=progress)
    except _RuntimeDataError as e:
        raise DataError(_one_line(e)) from None
    except OSError as e:
        raise _os_error(e, out) from None
    return Packed(kind, out, meta)


def _text_files(folder: Path) -> list[Path]:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in (".txt", ".md", ".text"))
    if not files:
        raise DataError(f"{folder}: no .txt or .md files to pack as text")
    return files


def pack_kind(sources: Iterable[str | os.PathLike]) -> str:
    """What `pack` makes of these inputs: "array" (an .npz or .csv), "shards" (an image
    folder) or "token_file" (text)."""
    from engine.data.inspection import guess_kind

    srcs = [Path(os.path.expanduser(str(s))) for s in sources]
    if len(srcs) == 1 and srcs[0].is_file() and srcs[0].suffix.lower() in (".npz", ".csv"):
        return "array"
    if len(srcs) == 1 and srcs[0].is_dir():
        try:
            if guess_kind(srcs[0]) == "image_folder":
                return "shards"
        except _RuntimeDataError:
            pass
    return "token_file"  # anything else is text


# ----- a project's data -------------------------------------------------------------------
@dataclass
class DataUse:
    """What `Project.use_data` did: training.dataset's new settings (`dataset`), the data
    set as the builder checks it (`info`: engine.data.describe.DataInfo), what --fit changed
    (`changes`), notes on settings taken from the diagram (`notes`), and every place the
    data and the diagram still disagree, one line naming the node (`mismatches`)."""

    dataset: dict
    info: Any
    changes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        i = self.info
        x = (", ".join(f"{k} {v[1]} {list(v[0])}" for k, v in i.inputs.items()) if i.inputs
             else f"{i.x_dtype} {list(i.sample_shape)}")
        classes = (f", vocabulary {i.n_classes:,}" if i.task == "language_model" and i.n_classes else
                   f", {i.n_classes:,} classes" if i.n_classes else "")
        lines = [f"training.dataset: {self.dataset['kind']} at {self.dataset['path']}",
                 (f"  {i.n_train + i.n_val:,} samples ({i.n_train:,} train, {i.n_val:,} val), x {x}, "
                  f"task {i.task}{classes}")]
        lines += [f"  {n}" for n in self.notes]
        lines += [f"  fitted {c}" for c in self.changes]
        return "\n".join(lines)


def _inputs(graph) -> list[str]:
    return [nid for nid, n in graph.nodes.items() if n.type == "Input"]


def use_data(project, path: str | os.PathLike, kind: str | None = None, *, fit: bool = False,
             **options: Any) -> DataUse:
    """Set `project`'s (an engine Project) training.dataset to the data set at `path`
    (relative to the current folder; kept relative to the project's folder when inside
    it). Settings of the same kind the project had are kept unless `options` change them;
    an image set's image_size and channels, and a token file's seq_len, follow the Input
    node when not given. With fit, the Input node(s) take the data's shape and dtype."""
    from engine.data.describe import describe_source
    from engine.files import ProjectError
    from engine.project import Training

    p = Path(os.path.expanduser(str(path)))
    abs_path = Path(os.path.abspath(p)) if "{" in p.name else real_path(p)
    if kind is None:
        from engine.data.inspection import guess_kind

        try:
            kind = guess_kind(abs_path)
        except _RuntimeDataError as e:
            raise DataError(_one_line(e)) from None
    old = project.training.dataset
    base = {k: v for k, v in old.model_dump(mode="json").items() if k != "path"} \
        if getattr(old, "kind", None) == kind else {}
    notes: list[str] = []
    given = {k: v for k, v in options.items() if v is not None}
    base.update(given)
    base.update(_follow_input(project.graph, kind, given, notes))
    s = settings(abs_path, kind, **{k: v for k, v in base.items() if k != "kind"})
    s["path"] = str(abs_path)
    try:
        info = describe_source(dict(s), with_fingerprint=False)
    except ProjectError as e:
        raise DataError(_one_line(e).removeprefix("training.dataset: ")) from None
    stored = dict(s)
    if project.path is not None:
        home = real_path(project.directory)
        if abs_path.is_relative_to(home):
            stored["path"] = os.path.relpath(abs_path, home)
    try:
        training = Training.model_validate({**project.training.model_dump(), "dataset": stored})
    except ValidationError as exc:
        from engine.project import _format_validation

        raise DataError(_one_line(_format_validation("training", exc))) from None
    changes = _fit_inputs(project.graph, info) if fit else []
    project.training = training
    return DataUse(stored, info, changes, notes, mismatches(project.graph, info))


def _follow_input(graph, kind: str, given: dict, notes: list[str]) -> dict:
    """image_size/channels (images) or seq_len (tokens) from the one Input node's shape."""
    ins = _inputs(graph)
    if len(ins) != 1:
        return {}
    shape = list(graph.nodes[ins[0]].params.get("shape") or [])
    out = {}
    if kind in ("image_folder", "shards") and len(shape) == 3 and shape[0] in (1, 3) and shape[1] == shape[2]:
        if "image_size" not in given:
            out["image_size"] = shape[1]
        if "channels" not in given:
            out["channels"] = shape[0]
    elif kind == "token_file" and len(shape) == 1 and "seq_len" not in given:
        out["seq_len"] = shape[0]
    if out:
        notes.append(", ".join(f"{k} {v}" for k, v in out.items()) + f" from node '{ins[0]}' (Input)")
    return out


def _fit_inputs(graph, info) -> list[str]:
    fed = {k: v for k, v in info.inputs.items()} if info.inputs else None
    ins = _inputs(graph)
    if fed is None:
        if len(ins) != 1:
            return []
        fed = {ins[0]: (info.sample_shape, info.x_dtype)}
    changes = []
    for nid, (shape, dtype) in fed.items():
        if nid not in graph.nodes or graph.nodes[nid].type != "Input":
            continue
        params = graph.nodes[nid].params
        want = {"shape": [int(d) for d in shape], "dtype": "int64" if str(dtype).startswith(("int", "uint"))
                else "float32"}
        old = {"shape": list(params.get("shape") or []), "dtype": params.get("dtype", "float32")}
        if old != want:
            for k, v in want.items():
                graph.set_param(nid, k, v)
            changes.append(f"node '{nid}' (Input): shape {old['shape']} -> {want['shape']}, dtype "
                           f"{old['dtype']} -> {want['dtype']}")
    return changes


def mismatches(graph, info) -> list[str]:
    """Where the diagram and the data set disagree (Input shape and dtype, the classifier's
    outputs against the classes, the loss against the task, an Embedding's size), one line
    each naming the node; engine/runs/build.py check_data is the builder's own check."""
    from engine.diagram.compile import compile_graph
    from engine.runs.build import check_data

    result = compile_graph(graph)
    if result.spec is None:
        first = str(result.errors[0]) if result.errors else "it does not compile"
        return [f"the diagram does not compile ({first}); the data is checked against it once it does"]
    return check_data(result, info)
