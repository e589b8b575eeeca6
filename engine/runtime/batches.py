"""A run's batches, a pure function of (seed, step), and its validation batches.

Two kinds of data reach a rank (the run spec's DataRef says which):
  - a data set read in place (data.source: an image folder, token files, Parquet, .npy,
    tar shards; runtime/datasets/): each rank reads only its share of each batch, through
    a DataLoader with workers, never the whole set;
  - a small generated set (synthetic sets, digits, a CSV) the builder wrote into the run
    folder as data.npz (data.path): read whole, it is small by construction.
Both take the global batch of step s from epoch s // steps_per_epoch, whose order is a
permutation seeded by (seed, epoch): resuming at step s needs no saved data position,
and every data-parallel layout sees the same global batch (each replica its share).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch


class Batches:
    """The batches of arrays held in memory (a run folder's data.npz)."""

    def __init__(self, x: np.ndarray, y: np.ndarray, batch_size: int, seed: int,
                 share: tuple[int, int | None] = (0, None), pin_memory: bool = False):
        if len(x) < batch_size:
            raise ValueError(f"batch_size {batch_size} is larger than the training set ({len(x)} samples); "
                             f"lower training.batch_size")
        self.x = torch.from_numpy(np.ascontiguousarray(x))
        self.y = torch.from_numpy(np.ascontiguousarray(y))
        self.batch_size = batch_size
        self.seed = seed
        self.lo, self.hi = share
        self.steps_per_epoch = len(x) // batch_size  # the last partial batch is dropped
        self.skipped = 0  # (nothing to skip in arrays: the counter the loop reports)
        self._perm_epoch = -1
        self._perm: torch.Tensor | None = None
        # a GPU run: each batch gathered straight into pinned host memory, so to_device's
        # non_blocking copy overlaps (from pageable memory it is a synchronous staged copy).
        # torch's caching host allocator keeps a block until the copies that read it are done.
        self.pin = pin_memory and torch.cuda.is_available()

    def _gather(self, src: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        if not self.pin:
            return src[idx]
        out = torch.empty((len(idx), *src.shape[1:]), dtype=src.dtype, pin_memory=True)
        return torch.index_select(src, 0, idx, out=out)

    def epoch_of(self, step: int) -> int:
        return step // self.steps_per_epoch

    def indices(self, step: int) -> torch.Tensor:
        epoch, i = divmod(step, self.steps_per_epoch)
        if epoch != self._perm_epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._perm = torch.from_numpy(rng.permutation(len(self.x)))
            self._perm_epoch = epoch
        assert self._perm is not None
        return self._perm[i * self.batch_size:(i + 1) * self.batch_size]

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self.indices(step)[self.lo:self.hi]
        return self._gather(self.x, idx), self._gather(self.y, idx)

    def close(self) -> None:
        pass


def load_npz(run_dir: Path, name: str = "data.npz") -> dict[str, np.ndarray]:
    with np.load(Path(run_dir) / name, allow_pickle=False) as z:
        return {k: z[k] for k in ("x_train", "y_train", "x_val", "y_val")}


def array_eval_batches(x: np.ndarray, y: np.ndarray, batch_size: int):
    xt, yt = torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y))
    for i in range(0, len(xt), batch_size):
        yield xt[i:i + batch_size], yt[i:i + batch_size]


def default_workers(source_kind: str, local_world: int) -> int:
    """Loader workers when the run does not say: decoding formats (images, shards) get the
    cores this rank's share of the machine has, up to 4; memory-mapped ones read in the
    rank's own process (a window of a token file is a slice, cheaper than a hand-off)."""
    if source_kind not in ("image_folder", "shards", "parquet"):
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(0, min(4, cores // max(1, local_world) - 1))


class RunData:
    """What a trainer reads: `train` (batch(step) -> this rank's share, epoch_of, skipped)
    and `val_batches(batch_size)`, from the run spec's data reference."""

    def __init__(self, run_dir: Path, data, batch_size: int, seed: int, *, share=(0, None), end_step=None,
                 local_world: int = 1, pin_memory: bool = False):
        self.source_kind = (data.source or {}).get("kind")
        if data.source:
            from .datasets import StepLoader, open_source

            opts = data.loader or {}
            workers = opts.get("workers")
            workers = default_workers(self.source_kind, local_world) if workers is None else int(workers)
            self._val = open_source(data.source, "val")
            self.strict = bool(opts.get("strict", False))
            self.train = StepLoader(open_source(data.source, "train"), batch_size, seed, share=share,
                                    end_step=end_step, workers=workers, prefetch=int(opts.get("prefetch", 2)),
                                    pin_memory=pin_memory and bool(opts.get("pin_memory", True)), strict=self.strict)
            self._arrays = None
        else:
            arrays = load_npz(run_dir, data.path)
            self.train = Batches(arrays["x_train"], arrays["y_train"], batch_size, seed, share, pin_memory=pin_memory)
            self._arrays = (arrays["x_val"], arrays["y_val"])

    def val_batches(self, batch_size: int):
        if self._arrays is not None:
            return array_eval_batches(*self._arrays, batch_size=batch_size)
        from .datasets import eval_batches

        return eval_batches(self._val, batch_size, strict=self.strict)

    def close(self) -> None:
        self.train.close()


def rows(x) -> int:
    """Samples in a batch's inputs (a tensor, or a dict of them)."""
    return len(next(iter(x.values()))) if isinstance(x, dict) else len(x)


def chunks(x, n: int) -> list:
    """A batch's inputs cut into n micro-batches along the batch dimension."""
    if isinstance(x, dict):
        parts = {k: v.chunk(n) for k, v in x.items()}
        return [{k: p[i] for k, p in parts.items()} for i in range(len(next(iter(parts.values()))))]
    return list(x.chunk(n))


def forward(model, x):
    """The model on a batch's inputs: several named inputs go to the Input nodes of their
    names (the GraphModule's placeholders), one goes to the one Input."""
    return model(**x) if isinstance(x, dict) else model(x)


def to_device(v, device: torch.device):
    """A batch's inputs (a tensor, or a dict of them for a model of several inputs) on device."""
    if isinstance(v, dict):
        return {k: t.to(device, non_blocking=True) for k, t in v.items()}
    return v.to(device, non_blocking=True)
