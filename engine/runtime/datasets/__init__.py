"""Data sets read in place, on any node: the readers of the training loop.

    source = open_source(settings, "train", base_dir)   # one split of a data set
    loader = StepLoader(source, batch_size, seed, share=(lo, hi), start_step=s, workers=4)
    x, y = loader.batch(step)                             # this rank's share of step's batch
    for x, y in eval_batches(open_source(settings, "val", base_dir), 256): ...

`settings` is the JSON of the project's training.dataset (engine/data/sources.py says its
fields); kinds: image_folder, token_file, parquet, array (npz: the same reader), shards. Formats that need Pillow
or pyarrow import them when opened, so this package imports with torch and numpy alone.
"""
from __future__ import annotations

from pathlib import Path

from .arrays import ArrayFile
from .base import TASKS, CorruptSample, DataError, Source, sample_seed
from .fingerprint import data_files, fingerprint
from .images import ImageFolder
from .loader import StepLoader, eval_batches
from .shards import Shards
from .tables import Parquet
from .tokens import TokenFile

KINDS = {"image_folder": ImageFolder, "token_file": TokenFile, "parquet": Parquet, "array": ArrayFile,
         "npz": ArrayFile, "shards": Shards}


def open_source(source: dict, split: str, base_dir: Path | None = None) -> Source:
    """One split ("train" or "val") of the data set that `source` (training.dataset's JSON)
    describes; relative paths are taken from base_dir (the project's folder)."""
    kind = source.get("kind")
    if kind not in KINDS:
        raise DataError(f"training.dataset.kind {kind!r} is not one of {', '.join(KINDS)}")
    if not source.get("path"):
        raise DataError(f"training.dataset.path: a {kind} data set needs a path")
    return KINDS[kind](source, split, Path(base_dir) if base_dir is not None else None)


__all__ = ["ArrayFile", "CorruptSample", "DataError", "ImageFolder", "KINDS", "Parquet", "Shards", "Source",
           "StepLoader", "TASKS", "TokenFile", "data_files", "eval_batches", "fingerprint", "open_source",
           "sample_seed"]
