"""image_folder: root/<class>/*.jpg|png|webp, the layout everyone uses.

Splits: root/train/<class> and root/val/<class> when both exist, otherwise one set of
class folders split by val_fraction (a permutation seeded by the settings' seed, so the
split is the same on every node). Classes are the sorted names of the training folders.

Decoding and the transforms are also used by the tar shards (shards.py): validation
resizes the shorter side then crops the centre; training takes a random resized crop
(area scale range, aspect ratio 3/4 to 4/3, as torchvision's RandomResizedCrop) and a
horizontal flip, drawn from a generator seeded by the sample's seed, so a sample's
augmentation depends on (run seed, epoch, index) only. The generator is Python's
random.Random (its random() sequence for an integer seed is guaranteed across Python
versions): a numpy Generator costs 30-50 us to create in a decoding loop, a tenth of a
small JPEG's whole budget. Output: float32 (C, S, S), normalised by mean and std.
Pillow is imported inside functions: see base.need.
"""
from __future__ import annotations

import io
import math
import os
import random
from pathlib import Path

import numpy as np
import torch

from .base import CorruptSample, DataError, Source, check_split, need, resolve

IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".webp")
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class ImageTransform:
    """Decode bytes or a file, then crop, flip and normalise to float32 (C, S, S)."""

    def __init__(self, settings: dict, fmt: str):
        self.fmt = fmt
        self.size = int(settings.get("image_size", 224))
        self.channels = int(settings.get("channels", 3))
        if self.channels not in (1, 3):
            raise DataError(f"{fmt}: channels must be 1 (grayscale) or 3 (RGB), not {self.channels}")
        self.resize = int(settings.get("resize") or round(self.size / 0.875))  # 224 -> 256
        self.random_crop = bool(settings.get("random_crop", True))
        self.scale = tuple(float(s) for s in settings.get("crop_scale", (0.08, 1.0)))
        self.flip = bool(settings.get("flip", True))
        mean = settings.get("mean") or (IMAGENET_MEAN if self.channels == 3 else (0.5,))
        std = settings.get("std") or (IMAGENET_STD if self.channels == 3 else (0.5,))
        if len(mean) != self.channels or len(std) != self.channels:
            raise DataError(f"{fmt}: mean and std need {self.channels} values each (one per channel)")
        # (x / 255 - mean) / std as one multiply-add per pixel
        self.mul = (1.0 / (255.0 * np.asarray(std, np.float32))).astype(np.float32)
        self.add = (-np.asarray(mean, np.float32) / np.asarray(std, np.float32)).astype(np.float32)

    def open(self, data: bytes | str, where):
        """A decoded PIL image in the mode of `channels`, or CorruptSample naming where()
        (a callable: the message is only built when it is needed). Any error of a decoder
        (a hostile file meets struct.error, IndexError, MemoryError, ... as well as OSError)
        is that sample's, never the run's."""
        Image = need("PIL.Image", self.fmt, "Pillow")
        try:
            with Image.open(io.BytesIO(data) if isinstance(data, bytes) else data) as im:
                return im.convert("RGB" if self.channels == 3 else "L")  # decodes the whole file
        except Exception as e:  # noqa: BLE001 - see above
            raise CorruptSample(f"{where()}: not a readable image ({_first_line(e)})") from None

    def __call__(self, data: bytes | str, seed: int | None, where) -> torch.Tensor:
        im = self.open(data, where)
        try:
            return self._crop(im, seed)
        except Exception as e:  # noqa: BLE001 - an image no crop fits (no pixels): the sample's error
            raise CorruptSample(f"{where()}: a {im.width}x{im.height} image that cannot be cropped to "
                                f"{self.size}x{self.size} ({_first_line(e)})") from None

    def _crop(self, im, seed: int | None) -> torch.Tensor:
        Image = need("PIL.Image", self.fmt, "Pillow")
        S, W, H = self.size, im.width, im.height
        if seed is None or not self.random_crop:
            # the shorter side to `resize`, then the centre S x S, in one resampling
            k = self.resize / min(W, H)
            cw, ch = min(W, S / k), min(H, S / k)
            box = ((W - cw) / 2, (H - ch) / 2, (W + cw) / 2, (H + ch) / 2)
            flip = seed is not None and self.flip and random.Random(seed).random() < 0.5
        else:
            u = random.Random(seed).random
            box = random_resized_box(W, H, self.scale, u)
            flip = self.flip and u() < 0.5
        im = im.resize((S, S), Image.BILINEAR, box=box)
        a = np.asarray(im, dtype=np.uint8)  # (S, S, C) or (S, S)
        if a.ndim == 2:
            a = a[:, :, None]
        if flip:
            a = a[:, ::-1]
        # channels first while still uint8, then the arithmetic on long rows: broadcasting
        # over a last axis of 3 runs numpy's inner loops 3 elements at a time (8x slower)
        out = np.ascontiguousarray(a.transpose(2, 0, 1)).astype(np.float32)  # (C, S, S)
        out *= self.mul[:, None, None]
        out += self.add[:, None, None]
        return torch.from_numpy(out)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:200]}" if text else type(e).__name__


def random_resized_box(W: int, H: int, scale, u) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params, drawing from u() (uniform in [0, 1)): a
    box of a random area fraction in `scale` and aspect ratio in [3/4, 4/3] (log-uniform),
    ten tries, then the centre crop of the image at the nearest allowed ratio (a narrow
    image, 17 x 50: its whole width and 4/3 of it in height), always inside the image."""
    area = W * H
    lo, hi = math.log(3 / 4), math.log(4 / 3)
    for _ in range(10):
        target = area * (scale[0] + (scale[1] - scale[0]) * u())
        ratio = math.exp(lo + (hi - lo) * u())
        w = int(round(math.sqrt(target * ratio)))
        h = int(round(math.sqrt(target / ratio)))
        if 0 < w <= W and 0 < h <= H:
            top, left = int(u() * (H - h + 1)), int(u() * (W - w + 1))
            return left, top, left + w, top + h
    ratio = W / H
    if ratio < 3 / 4:  # taller than 3:4: the whole width, a height of width / (3/4)
        w, h = W, min(H, int(round(W / (3 / 4))))
    elif ratio > 4 / 3:  # wider than 4:3: the whole height, a width of height x 4/3
        w, h = min(W, int(round(H * 4 / 3))), H
    else:
        w, h = W, H
    w, h = max(1, w), max(1, h)
    left, top = (W - w) // 2, (H - h) // 2
    return left, top, left + w, top + h


def class_folders(root: Path) -> list[str]:
    return sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))


def list_images(folder: Path) -> list[str]:
    """Image files under a class folder (subfolders included), sorted, relative to it."""
    out = []
    for dirpath, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        rel = os.path.relpath(dirpath, folder)
        out += [f if rel == "." else os.path.join(rel, f) for f in files
                if f.lower().endswith(IMAGE_EXTS) and not f.startswith(".")]
    return sorted(out)


class ImageFolder(Source):
    task = "classification"

    def __init__(self, settings: dict, split: str, base_dir: Path | None):
        check_split(split)
        self.split = split
        root = resolve(settings["path"], base_dir)
        if not root.is_dir():
            raise DataError(f"{root}: an image folder must be a directory (one subfolder per class)")
        self.transform = ImageTransform(settings, "image_folder")
        split_dirs = (root / "train").is_dir() and (root / "val").is_dir()
        top = root / "train" if split_dirs else root
        self.classes = class_folders(top)
        if not self.classes:
            raise DataError(f"{top}: no class folders (expected {top}/<class>/*.jpg)")
        self.n_classes = len(self.classes)
        if split_dirs:
            self.path = root / split
            extra = sorted(set(class_folders(self.path)) - set(self.classes))
            if extra:
                raise DataError(f"{self.path}: class folder {extra[0]!r} is not among the training classes")
            files, labels = self._scan(self.path, require_all=(split == "train"))
        else:
            self.path = root
            files, labels = self._scan(root, require_all=True)
            # a seeded split: the same on every node that has the same files
            perm = np.random.default_rng([int(settings.get("seed", 0)), 7919]).permutation(len(files))
            n_val = max(1, int(round(len(files) * float(settings.get("val_fraction") or 0.1))))
            if n_val >= len(files):
                raise DataError(f"{root}: {len(files)} images leave nothing to train on with val_fraction "
                                f"{settings.get('val_fraction')}")
            keep = np.sort(perm[:n_val] if split == "val" else perm[n_val:])
            files, labels = [files[i] for i in keep], labels[keep]
        self.files, self.labels = files, labels
        self.root = str(self.path)

    def _scan(self, top: Path, require_all: bool) -> tuple[list[str], np.ndarray]:
        files, labels = [], []
        for c, name in enumerate(self.classes):
            folder = top / name
            found = list_images(folder) if folder.is_dir() else []
            if not found and require_all:
                raise DataError(f"{folder}: empty class folder (no .jpg, .png or .webp images)")
            files += [os.path.join(name, f) for f in found]
            labels += [c] * len(found)
        if not files:
            raise DataError(f"{top}: no images in its class folders")
        return files, np.asarray(labels, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.files)

    def where(self, i: int) -> str:
        return str(self.path / self.files[i])

    def sample(self, i: int, seed: int | None):
        x = self.transform(os.path.join(self.root, self.files[i]), seed, lambda: self.where(i))
        return x, torch.tensor(int(self.labels[i]))

    def sample_spec(self) -> dict:
        S = self.transform.size
        return {"x": {"shape": [self.transform.channels, S, S], "dtype": "float32"},
                "y": {"shape": [], "dtype": "int64"}}
