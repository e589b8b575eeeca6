"""Project-file settings of every data set: those read in place (engine/runtime/datasets/),
then the generated sets, digits, npz and csv.

Each kind is a strict pydantic model (unknown fields are errors) whose JSON is what
engine/runtime/datasets.open_source takes: the runtime reads plain dicts, so it needs no
pydantic on a cluster node. Paths are relative to the project file or absolute. Bounds
say the field at fault, e.g. `image_size: Input should be less than or equal to 4096`.
"""
from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import Field, model_validator

from engine.schema import Strict

SEED = Field(0, ge=0, le=2 ** 31 - 1)  # the split's seed: numpy and torch take it; so does a spin box
Task = Literal["classification", "regression", "language_model", "multi_label"]
Unit = Annotated[float, Field(ge=0, le=1)]


class _ImageOptions(Strict):
    """Decoding and augmentation of images (image_folder, shards)."""

    image_size: int = Field(224, ge=1, le=4096)  # the square side the model sees
    channels: Literal[1, 3] = 3  # 1: grayscale, 3: RGB
    resize: Optional[int] = Field(None, ge=1, le=8192)  # validation: the shorter side first (default size / 0.875)
    random_crop: bool = True  # training: torchvision's RandomResizedCrop
    crop_scale: tuple[Unit, Unit] = (0.08, 1.0)  # its range of area fractions
    flip: bool = True  # training: horizontal flip with probability 1/2
    mean: Optional[list[float]] = None  # per channel; default ImageNet's (RGB) or 0.5 (grayscale)
    std: Optional[list[Annotated[float, Field(gt=0)]]] = None

    @model_validator(mode="after")
    def _check(self):
        if self.crop_scale[0] <= 0 or self.crop_scale[0] > self.crop_scale[1]:
            raise ValueError(f"crop_scale: {list(self.crop_scale)} must be (low, high) with 0 < low <= high <= 1")
        for name in ("mean", "std"):
            v = getattr(self, name)
            if v is not None and len(v) != self.channels:
                raise ValueError(f"{name}: {len(v)} values for {self.channels} channel(s)")
        if self.resize is not None and self.resize < self.image_size:
            raise ValueError(f"resize: {self.resize} is smaller than image_size {self.image_size}")
        return self


class ImageFolder(_ImageOptions):
    """root/<class>/*.jpg|png|webp, or root/train/<class> and root/val/<class>."""

    kind: Literal["image_folder"]
    path: str = Field(min_length=1)
    val_fraction: float = Field(0.1, gt=0, lt=1)  # when the root has no train/ and val/ folders
    seed: int = SEED


class TokenFile(Strict):
    """train.bin and val.bin (nanoGPT, llm.c), or one .bin split at its tail."""

    kind: Literal["token_file"]
    path: str = Field(min_length=1)
    seq_len: int = Field(256, ge=1, le=1_048_576)  # tokens a sample sees (its window holds seq_len + 1)
    vocab_size: Optional[int] = Field(None, ge=2, le=2 ** 32)  # default: meta.json beside the files
    dtype: Optional[Literal["uint16", "uint32"]] = None  # default: meta.json, the llm.c header, or uint16
    val_fraction: float = Field(0.1, gt=0, lt=1)  # one .bin: the last fraction of tokens is validation


class Parquet(Strict):
    """Parquet files or Hugging Face datasets' Arrow files, with named columns."""

    kind: Literal["parquet"]
    path: str = Field(min_length=1)
    inputs: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1, max_length=64)
    target: Optional[str] = Field(None, min_length=1)  # None only for language_model (targets = inputs shifted)
    task: Task = "classification"
    n_classes: Optional[int] = Field(None, ge=1, le=10_000_000)  # default: max target + 1
    seq_len: Optional[int] = Field(None, ge=1, le=1_048_576)  # list columns truncated or padded to it
    pad_id: int = Field(0, ge=-(2 ** 31), le=2 ** 31 - 1)
    val_fraction: float = Field(0.1, gt=0, lt=1)  # no train/val files: every round(1/f)-th row

    @model_validator(mode="after")
    def _check(self):
        if self.target is None and self.task != "language_model":
            raise ValueError("target: a column name is needed unless task is language_model")
        if self.task == "multi_label" and self.n_classes is None:
            raise ValueError("n_classes: a multi_label target needs it")
        return self


class ArrayFile(Strict):
    """An .npz (np.savez) or a folder of .npy: x, y or x_train, y_train, x_val, y_val."""

    kind: Literal["array"]
    path: str = Field(min_length=1)
    task: Optional[Task] = None  # default: classification for integer y, else regression
    n_classes: Optional[int] = Field(None, ge=1, le=10_000_000)
    val_fraction: float = Field(0.2, gt=0, lt=1)  # x and y only: every round(1/f)-th row


class Shards(_ImageOptions):
    """WebDataset-style tar shards: a folder, one .tar, or a pattern like s-{000..099}.tar."""

    kind: Literal["shards"]
    path: str = Field(min_length=1)
    n_classes: Optional[int] = Field(None, ge=1, le=10_000_000)  # default: max label + 1
    val_fraction: float = Field(0.1, gt=0, lt=1)  # no train*/val* shards: every round(1/f)-th sample


class LoaderSettings(Strict):
    """How the runtime reads: DataLoader workers per rank, batches read ahead, pinned host
    memory for faster copies to a GPU, and whether a corrupt sample stops the run."""

    workers: Optional[int] = Field(None, ge=0, le=64)  # None: by format and cores (runtime/data.py default_workers)
    prefetch: int = Field(2, ge=1, le=64)  # batches per worker read ahead
    pin_memory: bool = True  # only used on GPUs
    strict: bool = False  # False: a corrupt sample is skipped and counted


InPlaceDataset = ImageFolder | TokenFile | Parquet | ArrayFile | Shards
IN_PLACE_KINDS = ("image_folder", "token_file", "parquet", "array", "shards")


# ----- generated sets, digits, npz and csv: made whole when a run is prepared ----------
class SyntheticClassification(Strict):
    kind: Literal["synthetic_classification"]
    n_samples: int = Field(2048, ge=8, le=10_000_000)
    n_features: int = Field(32, ge=1, le=100_000)
    n_classes: int = Field(4, ge=2, le=10_000)
    noise: float = Field(0.5, ge=0)
    val_fraction: float = Field(0.2, gt=0, lt=1)
    seed: int = Field(0, ge=0, le=2 ** 31 - 1)  # numpy and torch take it; so does a spin box


class SyntheticRegression(Strict):
    kind: Literal["synthetic_regression"]
    n_samples: int = Field(2048, ge=8, le=10_000_000)
    n_features: int = Field(16, ge=1, le=100_000)
    n_targets: int = Field(1, ge=1, le=10_000)
    noise: float = Field(0.1, ge=0)
    val_fraction: float = Field(0.2, gt=0, lt=1)
    seed: int = Field(0, ge=0, le=2 ** 31 - 1)  # numpy and torch take it; so does a spin box


class SyntheticSequence(Strict):
    kind: Literal["synthetic_sequence"]
    n_samples: int = Field(2048, ge=8, le=10_000_000)
    seq_len: int = Field(16, ge=1, le=100_000)
    vocab_size: int = Field(32, ge=2, le=10_000_000)
    n_classes: int = Field(4, ge=2, le=10_000)
    # classify: one label per sequence; next_token: language modelling, the target of
    # each position is the next token (per-token logits (B, T, vocab) against (B, T))
    task: Literal["classify", "next_token"] = "classify"
    val_fraction: float = Field(0.2, gt=0, lt=1)
    seed: int = Field(0, ge=0, le=2 ** 31 - 1)  # numpy and torch take it; so does a spin box


class SyntheticImages(Strict):
    kind: Literal["synthetic_images"]
    n_samples: int = Field(2048, ge=8, le=10_000_000)
    channels: int = Field(3, ge=1, le=4096)
    height: int = Field(16, ge=1, le=4096)
    width: int = Field(16, ge=1, le=4096)
    n_classes: int = Field(4, ge=2, le=10_000)
    noise: float = Field(0.5, ge=0)
    val_fraction: float = Field(0.2, gt=0, lt=1)
    seed: int = Field(0, ge=0, le=2 ** 31 - 1)  # numpy and torch take it; so does a spin box


class Digits(Strict):
    """scikit-learn's handwritten digits (1797 8x8 images, shipped with the package)."""

    kind: Literal["digits"]
    image: bool = False  # True: (1, 8, 8) images; False: 64 features
    val_fraction: float = Field(0.2, gt=0, lt=1)
    seed: int = Field(0, ge=0, le=2 ** 31 - 1)  # numpy and torch take it; so does a spin box


class NpzFile(Strict):
    """x/y arrays (split by val_fraction) or x_train/y_train/x_val/y_val."""

    kind: Literal["npz"]
    path: str = Field(min_length=1)
    val_fraction: float = Field(0.2, gt=0, lt=1)
    seed: int = Field(0, ge=0, le=2 ** 31 - 1)  # numpy and torch take it; so does a spin box


class CsvFile(Strict):
    kind: Literal["csv"]
    path: str = Field(min_length=1)
    target: Union[str, int] = -1  # column name or index of the target
    task: Literal["classification", "regression"] = "classification"
    header: bool = True
    val_fraction: float = Field(0.2, gt=0, lt=1)
    seed: int = Field(0, ge=0, le=2 ** 31 - 1)  # numpy and torch take it; so does a spin box


# generated sets and a CSV (small: made whole when a run is prepared), then the data sets read
# in place (above; engine/runtime/datasets/ reads them on every rank)
Dataset = Union[SyntheticClassification, SyntheticRegression, SyntheticSequence, SyntheticImages, Digits, NpzFile, CsvFile,
                ImageFolder, TokenFile, Parquet, ArrayFile, Shards]
_DATASET_KINDS = ("synthetic_classification", "synthetic_regression", "synthetic_sequence",
                  "synthetic_images", "digits", "npz", "csv", "image_folder", "token_file", "parquet", "array", "shards")
