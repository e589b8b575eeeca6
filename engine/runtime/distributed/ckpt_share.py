"""The whole checkpoint where a resuming rank can read it, when the nodes' run folders differ.

Over SSH every node runs in a run folder of its own (remote/launch/ssh_torchrun.py), and
torch.distributed.checkpoint writes each rank's part where the rank is: no node holds the
whole. Rank 0's folder is the run's home (metrics, status, `latest`); so

    after every save    each other folder's first rank sends rank 0 the files it wrote
                        (point to point, in chunks; gloo on the CPU), and only then does
                        `latest` name the checkpoint (gather)
    at a resume         rank 0 sends its latest checkpoint, and `latest`, to every folder
                        that lacks any of it (spread): a node that comes back, or one that
                        never had the parts of the ranks lost, loads the same checkpoint as
                        rank 0, and every rank agrees on the step it resumes from

Folders are told apart by an id each writes once (logs/folder.id, created without a
race): nodes that share a file system (Slurm's shared work folder) share the id and send
nothing. torch, stdlib only.
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import torch
import torch.distributed as dist

from ..folder import LATEST

FOLDER_ID = "folder.id"  # in the run folder's logs/
CHUNK = 64 << 20  # bytes per message


def folder_id(run_dir: Path) -> str:
    """This run folder's id: made by whichever rank comes first (a hard link, which fails
    if the name exists: no rank reads half of one), read by the others."""
    path = Path(run_dir) / "logs" / FOLDER_ID
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{FOLDER_ID}.{os.getpid()}.tmp")
    tmp.write_text(uuid.uuid4().hex)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return path.read_text().strip()


class CheckpointSharing:
    """Which ranks send and receive (made by every rank at once: one all_gather)."""

    def __init__(self, run_dir: Path, group=None):
        self.group = group
        self.rank, world = dist.get_rank(), dist.get_world_size()
        ids: list = [None] * world
        dist.all_gather_object(ids, folder_id(run_dir), group=group)
        first: dict[str, int] = {}
        for r, i in enumerate(ids):
            first.setdefault(i, r)
        self.home = ids[0]
        self.here = [r for r, i in enumerate(ids) if i == self.home]  # the ranks that write into rank 0's folder
        self.keepers = sorted(r for i, r in first.items() if i != self.home)  # one rank per other folder

    @property
    def needed(self) -> bool:
        return bool(self.keepers)

    # ---- after a save ----
    def gather(self, ckpt: Path, group=None) -> int:
        """Rank 0's copy of `ckpt` gets every file another folder's ranks wrote; returns the
        bytes received (rank 0) or sent."""
        group = group if group is not None else self.group
        moved = 0
        if self.rank == 0:
            for src in self.keepers:
                moved += _receive(ckpt, src, group, skip_existing=True)
        elif self.rank in self.keepers:
            moved = _send(ckpt, sorted(p.name for p in ckpt.iterdir() if p.is_file()), 0, group)
        return moved

    # ---- at a resume ----
    def spread(self, ckpt_dir: Path, latest_name: str | None, group=None) -> int:
        """Every folder gets rank 0's checkpoint `latest_name` (under `ckpt_dir`, the folder
        of checkpoints) where any file of it is missing, and `latest` naming it."""
        group = group if group is not None else self.group
        listing = [None]
        if self.rank == 0 and latest_name is not None:
            d = ckpt_dir / latest_name
            listing = [(latest_name, sorted((p.name, p.stat().st_size) for p in d.iterdir() if p.is_file()))]
        dist.broadcast_object_list(listing, src=0, group=group)
        if listing[0] is None:
            return 0
        name, files = listing[0]
        d = ckpt_dir / name
        missing = []
        if self.rank in self.keepers:
            missing = [f for f, size in files if not (d / f).is_file() or (d / f).stat().st_size != size]
        wants: list = [None] * dist.get_world_size()
        dist.all_gather_object(wants, missing, group=group)
        moved = 0
        for r in self.keepers:
            if not wants[r]:
                continue
            if self.rank == 0:
                moved += _send(d, wants[r], r, group)
            elif self.rank == r:
                moved += _receive(d, 0, group, skip_existing=False)
        if self.rank in self.keepers:
            tmp = ckpt_dir / f"{LATEST}.{os.getpid()}.tmp"
            tmp.write_text(name)
            os.replace(tmp, ckpt_dir / LATEST)
        return moved


def _send(d: Path, names: list[str], dst: int, group) -> int:
    sizes = [(n, (d / n).stat().st_size) for n in names]
    dist.send_object_list([sizes], dst=dst, group=group)
    sent = 0
    for n, size in sizes:
        with open(d / n, "rb") as f:
            while True:
                chunk = f.read(CHUNK)
                if not chunk:
                    break
                dist.send(torch.frombuffer(bytearray(chunk), dtype=torch.uint8), dst=dst, group=group)
                sent += len(chunk)
    return sent


def _receive(d: Path, src: int, group, skip_existing: bool) -> int:
    box = [None]
    dist.recv_object_list(box, src=src, group=group)
    got = 0
    d.mkdir(parents=True, exist_ok=True)
    for n, size in box[0]:
        target = d / n
        keep = skip_existing and target.is_file() and target.stat().st_size == size
        tmp = d / f".{n}.{os.getpid()}.part"
        with (open(os.devnull, "wb") if keep else open(tmp, "wb")) as f:
            left = size
            while left:
                buf = torch.empty(min(CHUNK, left), dtype=torch.uint8)
                dist.recv(buf, src=src, group=group)
                f.write(buf.numpy().tobytes())
                left -= buf.numel()
                got += buf.numel()
        if not keep:
            os.replace(tmp, target)
    return got
