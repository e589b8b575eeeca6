"""Qt's system libraries for its X11 (xcb) platform plugin: which are missing, and the one
command that installs them.

PySide6's wheels carry Qt itself but not the system libraries its xcb plugin links
against (libxcb-cursor0 since Qt 6.5, libxcb-icccm4 and the other xcb utilities, EGL,
fontconfig, D-Bus). A fresh desktop may lack some of them, and the window then does not
open ("no Qt platform plugin could be initialized"). `ldd` on the plugin names every
library the loader cannot find ("libxcb-cursor.so.0 => not found"); each is mapped to
its package here. scripts/setup.sh runs `python -m app.qt_libs --install`: as root with
apt-get or dnf it installs them, otherwise it prints the one command that does.

Standard library only: it runs before anything of Qt can load.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# the library's name up to ".so" -> (Debian/Ubuntu package, Fedora/RHEL package)
PACKAGES: dict[str, tuple[str, str]] = {
    "libxcb-cursor": ("libxcb-cursor0", "xcb-util-cursor"),
    "libxcb-icccm": ("libxcb-icccm4", "xcb-util-wm"),
    "libxcb-keysyms": ("libxcb-keysyms1", "xcb-util-keysyms"),
    "libxcb-shape": ("libxcb-shape0", "libxcb"),
    "libxcb-randr": ("libxcb-randr0", "libxcb"),
    "libxcb-render-util": ("libxcb-render-util0", "xcb-util-renderutil"),
    "libxcb-image": ("libxcb-image0", "xcb-util-image"),
    "libxcb-util": ("libxcb-util1", "xcb-util"),
    "libxcb-xkb": ("libxcb-xkb1", "libxcb"),
    "libxcb-shm": ("libxcb-shm0", "libxcb"),
    "libxcb-sync": ("libxcb-sync1", "libxcb"),
    "libxcb-xfixes": ("libxcb-xfixes0", "libxcb"),
    "libxcb-render": ("libxcb-render0", "libxcb"),
    "libxcb-xinput": ("libxcb-xinput0", "libxcb"),
    "libxcb": ("libxcb1", "libxcb"),
    "libX11-xcb": ("libx11-xcb1", "libX11-xcb"),
    "libX11": ("libx11-6", "libX11"),
    "libxkbcommon-x11": ("libxkbcommon-x11-0", "libxkbcommon-x11"),
    "libxkbcommon": ("libxkbcommon0", "libxkbcommon"),
    "libEGL": ("libegl1", "libglvnd-egl"),
    "libGL": ("libgl1", "libglvnd-glx"),
    "libOpenGL": ("libopengl0", "libglvnd-opengl"),
    "libfontconfig": ("libfontconfig1", "fontconfig"),
    "libfreetype": ("libfreetype6", "freetype"),
    "libdbus-1": ("libdbus-1-3", "dbus-libs"),
    "libglib-2.0": ("libglib2.0-0", "glib2"),
    "libgthread-2.0": ("libglib2.0-0", "glib2"),
}

_NOT_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+not found", re.MULTILINE)


def plugin_path() -> Path | None:
    """PySide6's xcb platform plugin (found without importing Qt), or None."""
    spec = importlib.util.find_spec("PySide6")
    if spec is None or not spec.submodule_search_locations:
        return None
    plugin = Path(next(iter(spec.submodule_search_locations))) / "Qt" / "plugins" / "platforms" / "libqxcb.so"
    return plugin if plugin.exists() else None


def missing_libraries(plugin: str | os.PathLike) -> list[str]:
    """The libraries `plugin` (and what it links) needs that the loader cannot find, as
    ldd names them ("libxcb-cursor.so.0"), each once, in ldd's order."""
    out = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True, check=False).stdout
    return list(dict.fromkeys(_NOT_FOUND.findall(out)))


def _stem(soname: str) -> str:
    return soname.split(".so", 1)[0]


def packages_for(sonames: list[str], family: str = "debian") -> tuple[list[str], list[str]]:
    """(packages that provide `sonames`, sonames no package is known for)."""
    col = 1 if family == "fedora" else 0
    pkgs, unknown = [], []
    for so in sonames:
        entry = PACKAGES.get(_stem(so))
        if entry is None:
            unknown.append(so)
        elif entry[col] not in pkgs:
            pkgs.append(entry[col])
    return pkgs, unknown


def package_manager() -> str | None:
    """"apt-get" or "dnf" when this system has one (Debian/Ubuntu, Fedora/RHEL)."""
    return next((m for m in ("apt-get", "dnf") if shutil.which(m)), None)


def install_command(packages: list[str], manager: str | None, root: bool) -> list[str]:
    """The one command that installs `packages` (sudo unless already root)."""
    cmd = [manager or "apt-get", "install", "-y", *packages]
    return cmd if root else ["sudo", *cmd]


def check(plugin: str | os.PathLike | None = None, install: bool = False, out=sys.stdout) -> int:
    """Print what the xcb plugin lacks and how to get it; with `install`, as root with a
    package manager, install it. 0: nothing is missing (now); 1: something still is."""
    plugin = plugin or plugin_path()
    if not sys.platform.startswith("linux") or shutil.which("ldd") is None:
        return 0  # (the xcb plugin is Linux's; macOS and Windows wheels carry what they need)
    if plugin is None:
        print("Qt check: PySide6's xcb plugin is not installed here; nothing to check", file=out)
        return 0
    missing = missing_libraries(plugin)
    if not missing:
        print("Qt check: every system library of the window's platform plugin (xcb) is present", file=out)
        return 0
    manager = package_manager()
    pkgs, unknown = packages_for(missing, "fedora" if manager == "dnf" else "debian")
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    print(f"Qt check: the window cannot open yet: missing {', '.join(missing)}", file=out)
    if pkgs:
        cmd = install_command(pkgs, manager, root)
        if install and root and manager:
            print(f"Qt check: installing them: {' '.join(cmd)}", file=out, flush=True)
            if manager == "apt-get":
                subprocess.run(["apt-get", "update", "-qq"], check=False)
            env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
            subprocess.run(cmd, check=False, env=env)
            left = missing_libraries(plugin)
            if not left:
                print("Qt check: installed; the window can open", file=out)
                return 0
            print(f"Qt check: still missing {', '.join(left)}", file=out)
        else:
            print(f"Qt check: install them with:\n    {' '.join(cmd)}", file=out)
    if unknown:
        print(f"Qt check: no package known here for {', '.join(unknown)}: install what provides it", file=out)
    return 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m app.qt_libs", description=__doc__.splitlines()[0])
    p.add_argument("--install", action="store_true", help="install what is missing (as root, with apt-get or dnf)")
    p.add_argument("--plugin", help="the plugin to check (default: PySide6's libqxcb.so)")
    args = p.parse_args(argv)
    return check(args.plugin, install=args.install)


if __name__ == "__main__":
    sys.exit(main())
