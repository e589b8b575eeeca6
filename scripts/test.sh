#!/usr/bin/env bash
# Runs the whole test suite (2 workers; multi-process and GUI tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
export QT_QPA_PLATFORM=${QT_QPA_PLATFORM:-offscreen}
exec .venv/bin/python -m pytest -n ${LAYERFLOW_TEST_WORKERS:-2} --dist loadgroup "$@"
