"""Formats other tools read: a run's metrics as TensorBoard event files, MLflow runs."""
from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    """(the tracking commands are registered here)"""
