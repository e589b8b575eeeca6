"""The first-start check of Qt's system libraries (app/qt_libs.py, run by scripts/setup.sh):
on this machine's image, with one library hidden from a copy of the xcb plugin, the check
names it and prints the one command that installs its package."""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app import qt_libs

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = qt_libs.plugin_path()
pytestmark = pytest.mark.skipif(PLUGIN is None or not sys.platform.startswith("linux"), reason="PySide6's xcb plugin (Linux)")


def _plugin_without(tmp_path: Path, soname: bytes, renamed: bytes) -> Path:
    """A copy of the xcb plugin that needs `renamed` where the real one needs `soname`
    (same length, so the ELF stays valid): a library no loader can find. Its Qt libraries
    resolve as the real plugin's do ($ORIGIN/../../lib)."""
    assert len(soname) == len(renamed)
    data = PLUGIN.read_bytes()
    assert soname + b"\0" in data
    plugin = tmp_path / "plugins" / "platforms" / "libqxcb.so"
    plugin.parent.mkdir(parents=True)
    plugin.write_bytes(data.replace(soname + b"\0", renamed + b"\0"))
    (tmp_path / "lib").symlink_to(PLUGIN.parents[2] / "lib")
    return plugin


def test_a_hidden_library_is_named_with_its_package_and_the_command(tmp_path):
    plugin = _plugin_without(tmp_path, b"libxcb-cursor.so.0", b"libxcb-cursor.so.9")
    assert qt_libs.missing_libraries(plugin) == ["libxcb-cursor.so.9"]
    out = io.StringIO()
    assert qt_libs.check(plugin, out=out) == 1
    text = out.getvalue()
    assert "missing libxcb-cursor.so.9" in text
    manager = qt_libs.package_manager()
    pkg = "xcb-util-cursor" if manager == "dnf" else "libxcb-cursor0"
    assert f"install -y {pkg}" in text
    sudo = "" if os.geteuid() == 0 else "sudo "
    assert f"    {sudo}{manager or 'apt-get'} install -y {pkg}" in text


def test_the_command_line_check_run_as_setup_runs_it(tmp_path):
    plugin = _plugin_without(tmp_path, b"libxcb-icccm.so.4", b"libxcb-icccm.so.7")
    r = subprocess.run([sys.executable, "-m", "app.qt_libs", "--plugin", str(plugin)], cwd=ROOT,
                       capture_output=True, text=True, check=False, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 1, r.stderr
    pkg = "xcb-util-wm" if qt_libs.package_manager() == "dnf" else "libxcb-icccm4"
    assert "missing libxcb-icccm.so.7" in r.stdout and f"install -y {pkg}" in r.stdout
    assert "Traceback" not in r.stderr
    assert "app.qt_libs --install" in (ROOT / "scripts" / "setup.sh").read_text()


def test_the_real_plugin_here_and_the_package_table():
    found = qt_libs.missing_libraries(PLUGIN)
    out = io.StringIO()
    assert qt_libs.check(PLUGIN, out=out) == (1 if found else 0)
    if not found:
        assert "every system library" in out.getvalue()
    pkgs, unknown = qt_libs.packages_for(["libxcb-cursor.so.0", "libxcb-icccm.so.4", "libxkbcommon-x11.so.0",
                                          "libEGL.so.1", "libfontconfig.so.1", "libdbus-1.so.3", "libfoo.so.2"])
    assert pkgs == ["libxcb-cursor0", "libxcb-icccm4", "libxkbcommon-x11-0", "libegl1", "libfontconfig1", "libdbus-1-3"]
    assert unknown == ["libfoo.so.2"]
    assert qt_libs.install_command(["libgl1"], "apt-get", root=False) == ["sudo", "apt-get", "install", "-y", "libgl1"]
