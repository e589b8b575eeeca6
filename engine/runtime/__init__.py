"""What runs on every rank, shipped in a run's bundle to nodes that have only Python, torch
and numpy (tests/test_boundaries.py checks the allow-list). Launchers start it as
`python -m ENTRY RUN_DIR` (train.py), alone or under torchrun."""

ENTRY = "engine.runtime.train"  # the module every launcher runs (remote/launch/)
