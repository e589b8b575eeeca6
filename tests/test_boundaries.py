"""The rooms of docs/ARCHITECTURE.md, checked.

import-linter's contracts (pyproject.toml, [tool.importlinter]) say that app sits
over widgets and remote, which sit over engine and never import each other; that
engine and remote import no Qt and engine no SSH; and that no folder has an import
cycle. What import-linter cannot say (an allow-list) is checked here by a scan:
engine/runtime/ and remote/jobctl.py import only torch, numpy and the standard
library, since they are shipped to bare GPU nodes; the data readers of
engine/runtime/datasets/ may import Pillow and pyarrow inside a function (only the
formats that need them fail on a node without them)."""
import ast
import collections
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
                              "sys.argv[0] = 'lint-imports'; lint_imports_command()"]


def _lint(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(cwd))
    return subprocess.run([*LINT, "--no-cache", "--no-logo", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_import_linter_contracts_are_kept():
    proc = _lint(ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout and "no import cycles inside any folder KEPT" in proc.stdout


def test_the_contracts_see_a_cycle_and_a_wrong_way_import(tmp_path):
    """The same contracts on a small tree with a cycle in engine and engine importing app."""
    for pkg in ("app", "layerflow", "widgets", "remote", "engine"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "engine" / "planner.py").write_text("from engine import autoplace\n")
    (tmp_path / "engine" / "autoplace.py").write_text("from engine import planner\n")
    (tmp_path / "engine" / "graph.py").write_text("import app\n")
    text = (ROOT / "pyproject.toml").read_text()
    (tmp_path / "pyproject.toml").write_text(text[text.index("[tool.importlinter]"):])
    import tomllib

    for contract in tomllib.loads(text)["tool"]["importlinter"]["contracts"]:  # modules a contract names must exist
        for module in contract.get("source_modules", []):
            path = tmp_path.joinpath(*module.split("."))
            for parent in [p for p in path.parents if tmp_path in p.parents]:
                parent.mkdir(exist_ok=True)
                (parent / "__init__.py").touch()
            path.with_suffix(".py").touch()
    proc = _lint(tmp_path)
    assert proc.returncode == 1, proc.stdout
    assert "no import cycles inside any folder BROKEN" in proc.stdout
    assert ".planner -> .autoplace" in proc.stdout  # the import that would break the cycle
    assert "none imports one above it BROKEN" in proc.stdout and "engine.graph" in proc.stdout


def imports_of(paths, in_functions=True):
    """(path, module, level) of every import; in_functions=False leaves out those inside a
    function body."""
    for path in paths:
        tree = ast.parse(path.read_text(), str(path))
        queue = collections.deque([tree])  # breadth first, as ast.walk: in the file's order
        while queue:
            node = queue.popleft()
            if isinstance(node, ast.Import):
                for a in node.names:
                    yield path, a.name, 0
            elif isinstance(node, ast.ImportFrom):
                yield path, node.module or "", node.level
            if in_functions or not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                queue.extend(ast.iter_child_nodes(node))


# imported inside functions only, by the formats that need them (engine/runtime/datasets/)
OPTIONAL_IN_FUNCTIONS = {"PIL", "pyarrow"}


def node_side_violations(root: Path) -> list[tuple[str, str]]:
    """Imports of the node-side code (engine/runtime/, remote/jobctl.py) beyond torch,
    numpy and the standard library, or relative ones leaving engine/runtime; in
    engine/runtime/datasets/, PIL and pyarrow are let through inside functions."""
    allowed = {"torch", "numpy"} | set(sys.stdlib_module_names)
    runtime = root / "engine" / "runtime"
    readers = runtime / "datasets"
    paths = [*sorted(runtime.rglob("*.py")), root / "remote" / "jobctl.py"]
    top_level = {(p, m, lvl) for p, m, lvl in imports_of(paths, in_functions=False)}
    bad = []
    for p, m, lvl in imports_of(paths):
        if lvl > 0:  # relative: must stay inside engine/runtime
            inside = runtime in p.parents
            depth = len(p.relative_to(runtime).parts) - 1 if inside else -1
            if not inside or lvl > depth + 1:
                bad.append((str(p.relative_to(root)), "." * lvl + m))
        elif m.split(".")[0] not in allowed:
            optional = (readers in p.parents and m.split(".")[0] in OPTIONAL_IN_FUNCTIONS
                        and (p, m, lvl) not in top_level)
            if not optional:
                bad.append((str(p.relative_to(root)), m))
    return list(dict.fromkeys(bad))


def test_node_side_code_imports_only_torch_numpy_stdlib():
    assert node_side_violations(ROOT) == [], "engine/runtime and remote/jobctl.py must run on a node with only torch and numpy"


def test_the_scan_sees_a_violation(tmp_path):
    (tmp_path / "engine" / "runtime").mkdir(parents=True)
    (tmp_path / "remote").mkdir()
    (tmp_path / "engine" / "runtime" / "x.py").write_text("import torch\nfrom pydantic import BaseModel\nfrom .. import graph\n")
    (tmp_path / "remote" / "jobctl.py").write_text("import json\nimport paramiko\n")
    assert node_side_violations(tmp_path) == [("engine/runtime/x.py", "pydantic"), ("engine/runtime/x.py", ".."),
                                              ("remote/jobctl.py", "paramiko")]


def test_the_readers_may_import_pillow_and_pyarrow_inside_functions_only(tmp_path):
    (tmp_path / "engine" / "runtime" / "datasets").mkdir(parents=True)
    (tmp_path / "remote").mkdir()
    (tmp_path / "remote" / "jobctl.py").write_text("import json\n")
    (tmp_path / "engine" / "runtime" / "datasets" / "ok.py").write_text(
        "import numpy\ndef f():\n    from PIL import Image\n    import pyarrow.parquet\n")
    (tmp_path / "engine" / "runtime" / "datasets" / "top.py").write_text(
        "import pyarrow\ndef f():\n    import pandas\n")
    (tmp_path / "engine" / "runtime" / "elsewhere.py").write_text("def f():\n    import PIL\n")
    assert node_side_violations(tmp_path) == [("engine/runtime/datasets/top.py", "pyarrow"),
                                              ("engine/runtime/datasets/top.py", "pandas"),
                                              ("engine/runtime/elsewhere.py", "PIL")]


def imports_of_the_cli_inside_functions(paths) -> list[tuple[str, int]]:
    """`from app.cli import ...` (or `import app.cli`, `from app import cli`) inside a
    function: the way around an import cycle that import-linter cannot see. The command
    modules take CliError from app/cli/cli_errors.py at their top instead."""
    bad = []
    for path in paths:
        tree = ast.parse(path.read_text(), str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            for node in ast.walk(fn):
                named = [] if not isinstance(node, (ast.Import, ast.ImportFrom)) else [a.name for a in node.names]
                if isinstance(node, ast.ImportFrom) and node.level == 0:
                    named = [node.module] if node.module == "app.cli" else [
                        f"app.{n}" for n in named if node.module == "app"]
                if "app.cli" in named:
                    bad.append((path.name, node.lineno))
    return sorted(set(bad))


def test_no_module_imports_the_cli_inside_a_function():
    assert imports_of_the_cli_inside_functions(sorted((ROOT / "app").glob("*.py"))) == []


def test_the_cli_scan_sees_an_import_inside_a_function(tmp_path):
    (tmp_path / "cli_x.py").write_text(
        "from app.cli import main\n"  # at the top: fine (a test, main.py)
        "from app.cli.cli_errors import CliError\n"
        "def f():\n    from app.cli import CliError\n"
        "class C:\n    def g(self):\n        import app.cli\n"
        "async def h():\n    from app import cli\n")
    assert imports_of_the_cli_inside_functions([tmp_path / "cli_x.py"]) == [("cli_x.py", 4), ("cli_x.py", 7),
                                                                            ("cli_x.py", 9)]
