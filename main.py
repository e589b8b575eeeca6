"""Layerflow: `python main.py` opens the app; `python main.py <command>` is the CLI."""
import sys

from app.cli import main

if __name__ == "__main__":
    sys.exit(main())
