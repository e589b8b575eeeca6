"""sweep, runs: many runs of one project, queued and compared (engine/sweep.py)."""
from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    """(the sweep and runs commands are registered here)"""
