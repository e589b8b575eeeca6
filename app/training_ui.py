"""The Training dock, installed into the main window (app/window.py): the project's
training settings and precision/sync placement as a form (widgets/training_panel.py).

Each valid edit is one undo step (controller.set_training / set_mesh): it marks the
project modified and recompiles, so the summary's FLOPs per step and the plan follow
the batch size. Undo, redo and another project reload the form.
"""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDockWidget

from widgets.training_panel import TrainingPanel


def install(window) -> tuple[TrainingPanel, QDockWidget]:
    """The Training dock of `window`: (its panel, the dock); app/window.py calls this."""
    panel = TrainingPanel()
    panel.directory = lambda: window.project.directory  # engine/data.py reads relative paths from there
    dock = window.add_dock("Training", panel, Qt.RightDockWidgetArea)
    # a tab beside Inspector / Devices / Runs; the Inspector stays in front
    window.tabifyDockWidget(window.inspector_dock, dock)
    window.inspector_dock.raise_()
    c = window.controller
    panel.training_edited.connect(c.set_training)
    panel.placement_edited.connect(c.set_mesh)
    c.training_changed.connect(lambda: panel.set_training(window.project.training))
    c.placement_changed.connect(lambda: panel.set_placement(window.project.placement))

    def reload() -> None:
        p = window.project
        panel.set_project(p.training, p.placement)
    window.project_changed.connect(reload)
    reload()
    return panel, dock
