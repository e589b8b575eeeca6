"""What a newcomer trips on: a machine without openssh-server gets one line saying what
to install, not a traceback per remote test."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_without_sshd_the_remote_tests_say_what_to_install_in_one_line(tmp_path):
    env = dict(os.environ, LAYERFLOW_TEST_SSHD=str(tmp_path / "no-sshd-here"))
    # --basetemp of its own: without it, the inner pytest takes group and other access off
    # /tmp/pytest-of-USER, which the job board test opens to its users while it runs (their
    # logins then failed when the two ran at once)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:xdist",
                        "--basetemp", str(tmp_path / "inner"), "tests/remote/test_remote_ssh.py"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "openssh-server is not installed" in out and "apt-get install openssh-server" in out
    assert "Traceback" not in out and "FileNotFoundError" not in out
    assert " skipped" in out  # the tests that need sshd, for that one reason


def test_the_bundled_example_opens_as_the_users_copy_and_its_runs_stay_out_of_the_install(qtbot, tmp_path):
    from app.main_window import EXAMPLE
    from app.window import MainWindow
    from app.settings import Settings
    from engine.project import load_project
    from engine.runs.build import new_run_dir

    before = sorted(p.name for p in EXAMPLE.parent.iterdir())
    w = MainWindow(settings=Settings(tmp_path / "home"), recover=False)
    qtbot.addWidget(w)
    assert w.open_project(EXAMPLE)
    copy = tmp_path / "projects" / "examples" / EXAMPLE.name
    assert w.project.path == copy and copy.read_bytes() == EXAMPLE.read_bytes()
    assert "copied to" in w.statusBar().currentMessage()
    w.project.graph.move(next(iter(w.project.graph.nodes)), (500.0, 500.0))
    assert w.save()
    assert copy.read_bytes() != EXAMPLE.read_bytes()  # the install is untouched
    assert w.open_project(EXAMPLE) and w.project.path == copy  # reopened: the user's copy, edits kept
    assert "your copy" in w.statusBar().currentMessage()
    # the CLI on the installed file: its runs go to the user's data folder
    run = new_run_dir(load_project(EXAMPLE))
    assert run.parent == tmp_path / "data" / "example-runs"
    assert sorted(p.name for p in EXAMPLE.parent.iterdir()) == before


@pytest.mark.parametrize("width", [1600, 1000])
def test_the_example_opens_at_a_zoom_where_names_can_be_read(qtbot, tmp_path, width):
    """Wide enough: the whole example fitted, names drawn at a fixed screen size; too
    narrow for that: its start at a zoom where names read at their own size."""
    from app.main_window import EXAMPLE
    from app.window import MainWindow
    from app.settings import Settings
    from widgets.node_scene import LABEL_PX, _far_font

    w = MainWindow(settings=Settings(tmp_path / "home"), recover=False)
    qtbot.addWidget(w)
    w.resize(width, 1000)
    w.show()
    assert w.open_project(EXAMPLE)
    qtbot.waitUntil(lambda: w.view.zoom() < 1.0, timeout=3000)  # framed (after the first paint)
    assert w.view.zoom() >= w.view.FIT_READABLE - 1e-6
    view = w.view.visible_scene_rect()
    whole = all(view.contains(it.sceneBoundingRect()) for it in w.scene.node_items.values())
    if width == 1600 or (whole and w.view.zoom() < w.view.READABLE):  # (the example, top down, fits whole)
        assert all(view.contains(it.sceneBoundingRect()) for it in w.scene.node_items.values())  # all of it
        font, fm = _far_font(round(max(1.0, LABEL_PX / w.view.zoom() * 0.75), 1))
        assert fm.height() * w.view.zoom() >= LABEL_PX - 1  # as tall on screen as a name at 100%
    else:
        assert w.view.zoom() >= w.view.READABLE - 1e-6
        first = min(w.scene.node_items.values(), key=lambda it: it.pos().x())
        assert view.intersects(first.sceneBoundingRect())  # the diagram's start is in view
