#!/usr/bin/env bash
# Creates .venv and installs Layerflow with its test tools. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# torch first, pinned, so nothing pulls a multi-GB CUDA build on this machine.
.venv/bin/python -m pip install -q -c constraints.txt "torch==2.13.0"
.venv/bin/python -m pip install -q -c constraints.txt -e ".[test]"
# Qt's wheels carry Qt, not the system libraries its X11 window plugin needs (libxcb-cursor0,
# libxcb-icccm4, ...): installed here as root with apt-get or dnf, else the one command that
# installs them is printed (app/qt_libs.py). Tests and `screenshot` run offscreen without them.
.venv/bin/python -m app.qt_libs --install || echo "(the window needs them: run the command above once, then open it)"
echo "Layerflow is set up in .venv"
