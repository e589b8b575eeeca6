"""User settings (recent files, theme, window layout, the MLflow tracking URI) and the autosave folder.

Stored in an INI file in Layerflow's config folder (the same one remote/cluster.py
uses): $LAYERFLOW_CONFIG_DIR when set (tests point it at a temporary folder so they
never touch the user's), else the platform's user config folder.
"""
from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QSettings

MAX_RECENT = 10


def home() -> Path:
    from engine.trust import config_home

    return config_home()


class Settings:
    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root else home()
        self.root.mkdir(parents=True, exist_ok=True)
        self.qs = QSettings(str(self.root / "gui.ini"), QSettings.IniFormat)

    @property
    def autosave_dir(self) -> Path:
        d = self.root / "autosave"
        d.mkdir(parents=True, exist_ok=True)
        return d

    def recent_files(self) -> list[str]:
        v = self.qs.value("recent", [])
        if isinstance(v, str):
            v = [v]
        return [p for p in (v or []) if p]

    def add_recent(self, path: str | os.PathLike) -> None:
        path = str(Path(path).resolve())
        items = [path] + [p for p in self.recent_files() if p != path]
        self.qs.setValue("recent", items[:MAX_RECENT])
        self.qs.setValue("last_project", path)
        self.qs.sync()

    def clear_recent(self) -> None:
        self.qs.setValue("recent", [])
        self.qs.sync()

    def last_project(self) -> str | None:
        v = self.qs.value("last_project")
        return v if v and Path(v).exists() else None

    def theme(self) -> str:
        return self.qs.value("theme", "light")

    def set_theme(self, name: str) -> None:
        self.qs.setValue("theme", name)
        self.qs.sync()

    def autosave_seconds(self) -> int:
        return int(self.qs.value("autosave_seconds", 30))

    def mlflow_uri(self) -> str | None:
        """The MLflow tracking URI runs are logged to (`layerflow track uri`), or None: the
        one the commands read (engine/runs/tracking.py saved_uri), not a Qt setting."""
        from engine.runs.tracking import saved_uri

        return saved_uri()

    def set_mlflow_uri(self, uri: str | None) -> None:
        from engine.runs.tracking import save_uri

        save_uri(uri)

    def value(self, key: str, default=None):
        return self.qs.value(key, default)

    def set_value(self, key: str, value) -> None:
        self.qs.setValue(key, value)
        self.qs.sync()
