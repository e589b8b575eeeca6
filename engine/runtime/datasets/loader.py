"""The step loader: the global batch of step s, as a pure function of (seed, step), read
by a torch DataLoader so that reading overlaps compute.

The rule is the one of engine/runtime/batches.py (Batches): epoch, i = divmod(s,
steps_per_epoch); the epoch's order is np.random.default_rng([seed, epoch]).permutation(n);
the batch is order[i*B:(i+1)*B]; the last partial batch of an epoch is dropped. A set of
more than PERM_LIMIT samples (a 10 GB token file holds 40 M windows of 128: a permutation
array of 320 MB per rank, growing with the file) is ordered by a keyed permutation computed
per batch instead (`shuffled`: a Feistel network on the index bits, walked back into
range), so memory does not grow with the data set. Resuming
at step s needs no saved position, and each data-parallel rank reads only its share
[lo:hi] of the global batch: concatenating the shares gives the whole batch bit for bit.

Each DataLoader item is a whole step (a sampler yields (step, epoch, indices); batch_size
is None), so workers build batches in parallel and the order of steps is kept. A
sample's augmentation seed is sample_seed(seed, epoch, index): the same in every layout.

A corrupt sample (undecodable image, truncated record) is replaced by the next readable
sample in index order (with the seed of the one it replaces), so batches keep the size
that pipelines and micro-batches need, and counted in `skipped` (the first few messages
in `skipped_files`); strict=True raises instead. Errors cross the worker boundary
as values, so the user sees one line, not a worker's traceback.
"""
from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader, default_collate

from .base import CorruptSample, DataError, Source, sample_seed

MAX_SKIP_RUN = 64  # consecutive unreadable samples before giving up: the data is broken, not a sample
PERM_LIMIT = 1 << 22  # samples up to which an epoch's order is a stored permutation (int32: 16 MB)
_M64 = np.uint64((1 << 64) - 1)


def _round(r: np.ndarray, key: np.uint64, mask: np.uint64) -> np.ndarray:
    """A Feistel round function: splitmix64's finaliser of r ^ key, cut to the half's bits."""
    z = (r ^ key) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return (z ^ (z >> np.uint64(31))) & mask


def shuffled(positions: np.ndarray, n: int, seed: int, epoch: int) -> np.ndarray:
    """Where positions of an epoch's order land in [0, n): a permutation of range(n) keyed by
    (seed, epoch), computed for just these positions (no array of n is made). Four Feistel
    rounds permute the 2h-bit numbers (2^2h >= n); a result at or past n is sent through
    again (cycle walking), which keeps it a permutation of [0, n) and costs under 4 passes
    on average, as 2^2h < 4n."""
    h = max(1, (int(n - 1).bit_length() + 1) // 2)
    mask = np.uint64((1 << h) - 1)
    keys = np.random.default_rng([seed, epoch, 0x5EED]).integers(0, 2 ** 63, size=4, dtype=np.uint64)
    x = np.asarray(positions, dtype=np.uint64)
    out = np.empty_like(x)
    todo = np.arange(len(x))
    with np.errstate(over="ignore"):
        while len(todo):
            v = x[todo]
            left, right = v >> np.uint64(h), v & mask
            for k in keys:
                left, right = right, left ^ _round(right, k, mask)
            v = (left << np.uint64(h)) | right
            inside = v < np.uint64(n)
            out[todo[inside]] = v[inside]
            x[todo[~inside]] = v[~inside]
            todo = todo[~inside]
    return out.astype(np.int64)


def collate(samples: list) -> tuple:
    """[(x, y)] -> (X, Y), x a tensor or a dict of them. torch's default_collate, which in a
    worker stacks straight into shared memory (one copy fewer on the way to the trainer)."""
    x, y = default_collate(samples)
    return x, y


def read_batch(source: Source, indices, seeds, strict: bool):
    """(collated batch or None, skipped, error): a source that reads a batch at once
    (read_batch; no augmentation, so seeds do not matter) does; else, or when that meets
    a corrupt sample, sample by sample (read_samples, which names and skips it)."""
    fast = getattr(source, "read_batch", None)
    if fast is not None:
        try:
            return fast(indices), [], None
        except CorruptSample:
            pass
    samples, skipped, error = read_samples(source, indices, seeds, strict)
    return (None if error is not None else collate(samples)), skipped, error


def read_samples(source: Source, indices, seeds, strict: bool):
    """(samples, skipped [(index, message)], error message or None)."""
    n = len(source)
    out, skipped = [], []
    for i, seed in zip(indices, seeds):
        j = int(i)
        for _ in range(MAX_SKIP_RUN):
            try:
                out.append(source.sample(j, seed))
                break
            except CorruptSample as e:
                if strict:
                    return None, skipped, f"{e} (sample {j}; strict mode)"
                skipped.append((j, str(e)))
                j = (j + 1) % n
            except DataError as e:
                return None, skipped, str(e)
        else:
            return None, skipped, f"{source.path}: {MAX_SKIP_RUN} unreadable samples in a row from sample {int(i)}"
    return out, skipped, None


class _StepWork(torch.utils.data.Dataset):
    """What a worker runs: the item is (step, epoch, indices) and the result a whole batch."""

    def __init__(self, source: Source, seed: int, strict: bool):
        self.source, self.seed, self.strict = source, seed, strict

    def __getitem__(self, item):
        step, epoch, indices = item
        seeds = [sample_seed(self.seed, epoch, int(i)) for i in indices]
        xy, skipped, error = read_batch(self.source, indices, seeds, self.strict)
        return step, xy, skipped, error

    def __len__(self):  # not used: the sampler says how many steps
        return 0


class _Steps(torch.utils.data.Sampler):
    """Yields the work of steps start, start + 1, ... end - 1 (in the main process)."""

    def __init__(self, loader: "StepLoader"):
        self.loader, self.start = loader, 0

    def __iter__(self):
        L = self.loader
        step = self.start
        while L.end_step is None or step < L.end_step:
            yield step, L.epoch_of(step), L.indices(step)[L.lo:L.hi]
            step += 1


def _identity(x):
    return x


class StepLoader:
    def __init__(self, source: Source, batch_size: int, seed: int, *, share: tuple[int, int | None] = (0, None),
                 start_step: int = 0, end_step: int | None = None, workers: int = 0, prefetch: int = 2,
                 pin_memory: bool = False, strict: bool = False):
        n = len(source)
        if n < batch_size:
            raise DataError(f"batch_size {batch_size} is larger than the training set ({n} samples in "
                            f"{source.path}); lower training.batch_size")
        lo, hi = share
        hi = batch_size if hi is None else hi
        if not 0 <= lo < hi <= batch_size:
            raise ValueError(f"share {share} is not a slice of a batch of {batch_size}")
        self.source, self.batch_size, self.seed = source, batch_size, seed
        self.lo, self.hi, self.end_step = lo, hi, end_step
        self.steps_per_epoch = n // batch_size  # the last partial batch is dropped
        self.skipped, self.skipped_files = 0, []
        self._perm_epoch, self._perm = -1, None
        self._sampler = _Steps(self)
        self._sampler.start = start_step
        self._loader = DataLoader(_StepWork(source, seed, strict), batch_size=None, sampler=self._sampler,
                                  num_workers=workers, collate_fn=_identity, pin_memory=pin_memory,
                                  prefetch_factor=prefetch if workers else None, persistent_workers=workers > 0)
        self._it, self._next = None, start_step

    def epoch_of(self, step: int) -> int:
        return step // self.steps_per_epoch

    def indices(self, step: int) -> np.ndarray:
        """The sample indices of the global batch of step (all of it, not only this share)."""
        epoch, i = divmod(step, self.steps_per_epoch)
        n = len(self.source)
        if n > PERM_LIMIT:  # the order computed for this batch alone: memory flat in the data's size
            return shuffled(np.arange(i * self.batch_size, (i + 1) * self.batch_size), n, self.seed, epoch)
        if epoch != self._perm_epoch:
            perm = np.random.default_rng([self.seed, epoch]).permutation(len(self.source))
            # the one thing held per sample: int32 halves it (5 M token windows: 20 MB, not 40)
            self._perm = perm.astype(np.int32) if len(perm) < 2 ** 31 else perm
            self._perm_epoch = epoch
        return self._perm[i * self.batch_size:(i + 1) * self.batch_size]

    def batch(self, step: int) -> tuple:
        """This rank's share of the global batch of step: (x, y), x a tensor or a dict of them.
        Consecutive steps stream from the workers; another step restarts them there."""
        if self.end_step is not None and step >= self.end_step:
            raise IndexError(f"step {step} is past end_step {self.end_step}")
        if self._it is None or step != self._next:
            self._sampler.start = step
            self._it = iter(self._loader)  # persistent workers are reset, not restarted
        got, xy, skipped, error = next(self._it)
        assert got == step, (got, step)
        self._next = step + 1
        self.skipped += len(skipped)
        for _, msg in skipped:
            if len(self.skipped_files) < 5:
                self.skipped_files.append(msg)
        if error is not None:
            raise DataError(error)
        return xy

    def close(self) -> None:
        """Stop the workers (also done when the loader is garbage collected)."""
        it = getattr(self._loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        self._it = None
        self._loader._iterator = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def eval_batches(source: Source, batch_size: int, share: tuple[int, int | None] = (0, None), *,
                 strict: bool = False):
    """The whole split in order, batch_size samples at a time (the last batch may be
    shorter), no augmentation; share slices each batch as StepLoader does. A corrupt sample
    is replaced as in StepLoader (strict raises)."""
    n = len(source)
    for start in range(0, n, batch_size):
        idx = np.arange(start, min(start + batch_size, n))
        lo, hi = share
        idx = idx[lo:hi]
        if not len(idx):
            continue
        xy, _, error = read_batch(source, idx, [None] * len(idx), strict)
        if error is not None:
            raise DataError(error)
        yield xy
