"""A full disk is one line naming the file, never a traceback, in the commands that write
data and projects (issue 45, item 4): `data pack` (text, an image folder, an .npz, a .csv)
and `resolve` (a project written in place). The full disk is a real one, as in
test_one_line_errors.py: a 1 MB tmpfs in a user+mount namespace of the test's own, the
inputs copied in, then filled; or, where no namespace can be made, a file size limit
(RLIMIT_FSIZE, EFBIG). Real processes, real files."""
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "resources" / "examples" / "mlp_digits.lflow"

FULL_DISK = r"""
set -e
mount -t tmpfs -o size=1m tmpfs "$DISK"
mkdir -p "$DISK/config"
if [ -n "$SEED" ]; then cp -r "$SEED"/. "$DISK/"; fi
head -c 4000000 /dev/zero > "$DISK/fill" 2>/dev/null || true
set +e
"$PY" "$MAIN" "$@"
rc=$?
echo "LEFT: $(find "$DISK" -mindepth 1 -printf "%P ")"
exit $rc
"""


def _can_unshare(folder: Path) -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    probe = subprocess.run([unshare, "-rm", "sh", "-c", f"mount -t tmpfs tmpfs {folder}"], capture_output=True)
    return probe.returncode == 0


@pytest.fixture
def full_disk(tmp_path):
    """run(*args, seed=FOLDER) -> (CompletedProcess, reason, files left on the disk): the CLI
    with DISK (tmp_path/disk, holding a copy of seed's files) on a full file system."""
    disk = tmp_path / "disk"
    disk.mkdir()
    env = {**os.environ, "DISK": str(disk), "PY": sys.executable, "MAIN": str(ROOT / "main.py"),
           "LAYERFLOW_CONFIG_DIR": str(disk / "config"), "OMP_NUM_THREADS": "1"}
    if _can_unshare(disk):
        def run(*args, seed=None):
            r = subprocess.run(["unshare", "-rm", "bash", "-c", FULL_DISK, "bash", *map(str, args)], cwd=tmp_path,
                               env={**env, "SEED": str(seed or "")}, capture_output=True, text=True, timeout=240)
            left = next(line for line in r.stdout.splitlines() if line.startswith("LEFT: "))
            left = {f for f in left.split()[1:] if not f.endswith(".lock")}
            return r, "No space left on device (the disk is full", left
        return run

    import resource
    import signal

    def limit():  # every file this process writes is "too large" (EFBIG), as on a full disk
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    xdg = tmp_path / "xdg"  # the edit locks' folder (else found by tempfile, which writes a probe: refused here)
    xdg.mkdir(mode=0o700)
    env["XDG_RUNTIME_DIR"] = str(xdg)

    def run(*args, seed=None):
        if seed:
            shutil.copytree(seed, disk, dirs_exist_ok=True)
        (disk / "config").mkdir(exist_ok=True)
        r = subprocess.run([sys.executable, str(ROOT / "main.py"), *map(str, args)], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=240, preexec_fn=limit)
        return r, "File too large", {str(p.relative_to(disk)) for p in disk.rglob("*")}
    return run


def one_line(r, *needles) -> str:
    err = r.stderr.strip()
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    for n in needles:
        assert n in err, (n, err)
    return err


def inputs(root: Path) -> dict[str, Path]:
    """Each kind of input `data pack` takes (small: the disk is full to its last page)."""
    root.mkdir()
    (root / "a.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 3_000)
    rng = np.random.default_rng(0)
    np.savez_compressed(root / "d.npz", x=rng.random((2_000, 16), dtype=np.float32), y=np.arange(2_000) % 3)
    rnd = random.Random(0)
    with open(root / "t.csv", "w") as f:
        f.write("a,b,c,d,label\n")
        for _ in range(5_000):
            f.write(",".join(f"{rnd.random():.6f}" for _ in range(4)) + f",{rnd.choice('xyz')}\n")
    from PIL import Image

    for c in ("cat", "dog"):
        (root / "imgs" / c).mkdir(parents=True)
        for i in range(10):
            arr = rng.integers(0, 256, (48, 48, 3), dtype=np.uint8)  # noise: PNG cannot shrink it
            Image.fromarray(arr).save(root / "imgs" / c / f"{i}.png")
    return {"text": root / "a.txt", "npz": root / "d.npz", "csv": root / "t.csv", "images": root / "imgs"}


@pytest.mark.parametrize("kind, written", [("text", "tok/train.bin"), ("npz", "out/x.npy"), ("csv", "out/x.npy"),
                                           ("images", "out/data-000000.tar")])
def test_data_pack_on_a_full_disk_is_one_line_naming_the_file(full_disk, tmp_path, kind, written):
    src = inputs(tmp_path / "src")[kind]
    out = tmp_path / "disk" / written.split("/")[0]
    r, reason, left = full_disk("data", "pack", src, out, "--quiet")
    one_line(r, f"{tmp_path / 'disk' / written}: ", reason)
    assert not [f for f in left if ".tmp-" in f], left  # no temporary file left behind


def test_resolve_on_a_full_disk_is_one_line_and_leaves_the_file_as_it_was(full_disk, tmp_path):
    seed = tmp_path / "seed"
    seed.mkdir()
    d = json.loads(MLP.read_text())
    for name, lr in (("base", 0.003), ("ours", 0.01), ("theirs", 0.02)):
        d["training"]["optimizer"]["lr"] = lr
        (seed / f"{name}.lflow").write_text(json.dumps(d))
    env = {**os.environ, "LAYERFLOW_CONFIG_DIR": str(tmp_path / "config")}
    m = subprocess.run([sys.executable, str(ROOT / "main.py"), "merge", "base.lflow", "ours.lflow", "theirs.lflow"],
                       cwd=seed, env=env, capture_output=True, text=True, timeout=120)
    assert m.returncode == 1 and "1 conflict" in m.stderr, m.stderr  # the conflict, recorded in ours.lflow
    (seed / "base.lflow").unlink()
    (seed / "theirs.lflow").unlink()
    before = (seed / "ours.lflow").read_bytes()
    r, reason, left = full_disk("resolve", tmp_path / "disk" / "ours.lflow", "--theirs", seed=seed)
    one_line(r, f"{tmp_path / 'disk' / 'ours.lflow'}: ", reason)
    assert left <= {"config", "fill", "ours.lflow"}, left  # no temporary file left behind
    if "fill" in left:  # (the tmpfs: gone with its namespace; the file-size limit: the file is here to read)
        return
    assert (tmp_path / "disk" / "ours.lflow").read_bytes() == before
