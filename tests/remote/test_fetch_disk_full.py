"""`fetch` onto a full disk ends in one line naming the file and saying the disk is full,
not a traceback nor an SSH error (issue 45, item 4). A real job on the loopback sshd, then
`python main.py fetch` in a process whose output folder is a real full disk: a 1 MB tmpfs
in a user+mount namespace of its own, filled (or, where no namespace can be made, a file
size limit: RLIMIT_FSIZE, EFBIG)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main

from sshd_helpers import REMOTE_PYTHON, USER, free_port

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "resources" / "examples"

FULL_DISK = r"""
set -e
mount -t tmpfs -o size=1m tmpfs "$DISK"
head -c 4000000 /dev/zero > "$DISK/fill" 2>/dev/null || true
set +e
"$PY" "$MAIN" "$@"
rc=$?
echo "LEFT: $(find "$DISK" -mindepth 1 -type f -printf "%P ")"
exit $rc
"""


def _can_unshare(folder: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs tmpfs {folder}"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.slow
@pytest.mark.xdist_group("remote-deploy")
def test_fetch_onto_a_full_disk_is_one_line_naming_the_file(sshd_pair, config_dir, tmp_path, capsys):
    s = sshd_pair.servers[0]
    assert main(["cluster", "add", "one", "--host", f"{USER}@{s.addr}:{s.port}", "--identity",
                 str(sshd_pair.client_key), "--workdir", str(tmp_path / "work"), "--python", REMOTE_PYTHON,
                 "--known-hosts", str(sshd_pair.known_hosts), "--env", "OMP_NUM_THREADS=1",
                 "--rdzv-port", str(free_port("127.0.0.2"))]) == 0
    proj = tmp_path / "proj" / "mlp.lflow"
    proj.parent.mkdir()
    shutil.copy(EXAMPLES / "mlp_digits.lflow", proj)
    capsys.readouterr()
    assert main(["deploy", str(proj), "--cluster", "one", "--steps", "3", "--out", str(tmp_path / "rd")]) == 0
    job_id = capsys.readouterr().out.strip()
    assert main(["logs", job_id, "-f"]) == 0
    capsys.readouterr()

    disk = tmp_path / "disk"
    disk.mkdir()
    env = {**os.environ, "DISK": str(disk), "PY": sys.executable, "MAIN": str(ROOT / "main.py"),
           "LAYERFLOW_CONFIG_DIR": str(config_dir), "OMP_NUM_THREADS": "1"}
    args = ["fetch", job_id, "-o", str(disk / "got")]
    if _can_unshare(disk):
        r = subprocess.run(["unshare", "-rm", "bash", "-c", FULL_DISK, "bash", *args], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=240)
        reason = "No space left on device (the disk is full"
        left = next(line for line in r.stdout.splitlines() if line.startswith("LEFT: ")).split()[1:]
    else:
        import resource
        import signal

        def limit():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

        r = subprocess.run([sys.executable, str(ROOT / "main.py"), *args], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=240, preexec_fn=limit)
        reason = "File too large"
        left = [str(p.relative_to(disk)) for p in disk.rglob("*") if p.is_file()]
    err = r.stderr.strip()
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert f"{disk / 'got'}/" in err and reason in err, err  # the file being written, here
    assert not [f for f in left if ".part-" in f], left  # no half-downloaded file left behind


def test_deploy_onto_a_full_disk_is_one_line_and_leaves_no_run_folder(config_dir, tmp_path):
    """`deploy --out` on a full disk: its local run folder cannot be made; one line naming
    it and saying the disk is full, before any host is reached (the profile's host answers
    nothing), and nothing of the run left on the disk."""
    env = {**os.environ, "LAYERFLOW_CONFIG_DIR": str(config_dir), "OMP_NUM_THREADS": "1"}
    assert main(["cluster", "add", "one", "--host", f"{USER}@127.0.0.1:1", "--workdir", str(tmp_path / "work")]) == 0
    proj = tmp_path / "proj" / "mlp.lflow"
    proj.parent.mkdir()
    shutil.copy(EXAMPLES / "mlp_digits.lflow", proj)
    disk = tmp_path / "disk"
    disk.mkdir()
    env.update(DISK=str(disk), PY=sys.executable, MAIN=str(ROOT / "main.py"))
    args = ["deploy", str(proj), "--cluster", "one", "--steps", "3", "--out", str(disk / "rd")]
    if not _can_unshare(disk):  # (a file-size limit fails every write, tempfile's probe too: no full disk alone)
        pytest.skip("needs a user+mount namespace for a real full disk")
    r = subprocess.run(["unshare", "-rm", "bash", "-c", FULL_DISK, "bash", *args], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=240)
    reason = "No space left on device (the disk is full"
    left = next(line for line in r.stdout.splitlines() if line.startswith("LEFT: ")).split()[1:]
    assert left == ["fill"], left  # no run folder, no temp file
    err = r.stderr.strip()
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert f"{disk / 'rd'}" in err and reason in err, err
