"""The rooms of DESIGN.md, checked: engine/ and remote/ import no Qt;
engine/runtime/ imports only torch, numpy and the standard library (it is shipped
to bare GPU nodes); engine/ imports nothing from app/, widgets/ or remote/."""
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QT = {"PySide6", "PyQt5", "PyQt6", "pyqtgraph", "shiboken6", "qtpy"}


def imports_of(folder: str):
    for path in sorted((ROOT / folder).rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    yield path, a.name, 0
            elif isinstance(node, ast.ImportFrom):
                yield path, node.module or "", node.level


def test_engine_and_remote_import_no_qt():
    bad = [(str(p.relative_to(ROOT)), m) for folder in ("engine", "remote")
           for p, m, lvl in imports_of(folder) if lvl == 0 and m.split(".")[0] in QT]
    assert bad == []


def test_engine_imports_no_app_widgets_or_paramiko():
    bad = [(str(p.relative_to(ROOT)), m) for p, m, lvl in imports_of("engine")
           if lvl == 0 and m.split(".")[0] in {"app", "widgets", "remote", "paramiko"}]
    assert bad == []


def test_runtime_imports_only_torch_numpy_stdlib():
    allowed = {"torch", "numpy"} | set(sys.stdlib_module_names)
    bad = []
    for p, m, lvl in imports_of("engine/runtime"):
        if lvl > 0:  # relative: must stay inside engine/runtime
            depth = len(p.relative_to(ROOT / "engine" / "runtime").parts) - 1
            if lvl > depth + 1:
                bad.append((str(p.relative_to(ROOT)), "." * lvl + m))
            continue
        if m.split(".")[0] not in allowed:
            bad.append((str(p.relative_to(ROOT)), m))
    assert bad == [], "engine/runtime must run on a node with only torch and numpy"


def test_the_check_sees_a_violation(tmp_path, monkeypatch):
    """The scan itself works: a Qt import in a scanned folder is found."""
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "x.py").write_text("from PySide6 import QtCore\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    found = [m for _, m, _ in imports_of("engine")]
    assert found == ["PySide6"]
