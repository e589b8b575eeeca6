"""Batches for the training loop, a pure function of (seed, step).

The data of a run is RUN_DIR/data.npz (written by engine/run.py; the run spec's data.path
names it). The batch of global step s comes from epoch s // steps_per_epoch, whose order
is a permutation seeded by (seed, epoch): resuming at step s needs no saved data position,
and every data-parallel layout sees the same global batch (each replica takes its slice).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


class Batches:
    def __init__(self, x: np.ndarray, y: np.ndarray, batch_size: int, seed: int):
        if len(x) < batch_size:
            raise ValueError(f"batch_size {batch_size} is larger than the training set ({len(x)} samples); "
                             f"lower training.batch_size")
        self.x = torch.from_numpy(np.ascontiguousarray(x))
        self.y = torch.from_numpy(np.ascontiguousarray(y))
        self.batch_size = batch_size
        self.seed = seed
        self.steps_per_epoch = len(x) // batch_size  # the last partial batch is dropped
        self._perm_epoch = -1
        self._perm: torch.Tensor | None = None

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
        idx = self.indices(step)
        return self.x[idx], self.y[idx]


def load_npz(run_dir: Path, name: str = "data.npz") -> dict[str, np.ndarray]:
    with np.load(Path(run_dir) / name, allow_pickle=False) as z:
        return {k: z[k] for k in ("x_train", "y_train", "x_val", "y_val")}


def eval_batches(x: np.ndarray, y: np.ndarray, batch_size: int):
    xt, yt = torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y))
    for i in range(0, len(xt), batch_size):
        yield xt[i:i + batch_size], yt[i:i + batch_size]
