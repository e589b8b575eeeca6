"""Totals for the diagram: parameters, FLOPs, memory per device (when a plan exists)."""
from __future__ import annotations

from PySide6.QtWidgets import QFormLayout, QHeaderView, QLabel, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget

from widgets.style import human, human_bytes


class SummaryPanel(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 6, 10, 6)
        form = QFormLayout()
        lay.addLayout(form)
        self.fields: dict[str, QLabel] = {}
        for key, label in (("status", "status"), ("nodes", "nodes / edges"), ("params", "parameters"),
                           ("param_bytes", "parameter memory"), ("flops", "forward FLOPs / sample"),
                           ("flops_step", "train FLOPs / step")):
            w = QLabel("–")
            w.setObjectName(key)
            self.fields[key] = w
            form.addRow(label, w)
        self.devices = QTableWidget(0, 3)
        self.devices.setHorizontalHeaderLabels(["device", "memory (predicted)", "stage"])
        self.devices.horizontalHeader().setStretchLastSection(True)
        self.devices.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)  # no cut header
        self.devices.verticalHeader().hide()
        self.devices.hide()
        lay.addWidget(self.devices)
        lay.addStretch(1)

    def set_result(self, graph, result, batch_size: int = 1) -> None:
        f = self.fields
        f["nodes"].setText(f"{len(graph.nodes)} / {len(graph.edges)}")
        if result is None:
            return
        n_err, n_warn = len(result.errors), len(result.warnings)
        f["status"].setText("ready" if result.ok and not n_warn else
                            f"{n_err} error(s), {n_warn} warning(s)")
        f["params"].setText(f"{result.total_params:,}  ({human(result.total_params)})")
        f["param_bytes"].setText(human_bytes(4 * result.total_params) + " (float32)")
        f["flops"].setText(human(result.total_flops))
        # forward + backward is about 3x forward, times the batch
        f["flops_step"].setText(f"{human(3 * result.total_flops * batch_size)} (batch {batch_size})")

    def set_devices(self, rows: list[tuple[str, int, str]] | None) -> None:
        """rows: (device name, bytes, stage text) from the plan; None hides the table."""
        if not rows:
            self.devices.hide()
            return
        self.devices.setRowCount(len(rows))
        for i, (name, nbytes, stage) in enumerate(rows):
            self.devices.setItem(i, 0, QTableWidgetItem(name))
            self.devices.setItem(i, 1, QTableWidgetItem(human_bytes(nbytes)))
            self.devices.setItem(i, 2, QTableWidgetItem(stage))
        self.devices.show()
