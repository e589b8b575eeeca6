"""The runs table: one row per run (engine/runs/history.py run_row), settings as columns, final
and best metrics, throughput, peak memory, predicted against measured step time, the
restarts, the time they cost and the layout each attempt ran ("dp2 → dp1").
Sortable (numbers as numbers) and filterable through a QSortFilterProxyModel: the filter
box takes text (any column contains it) or expressions as `layerflow runs --filter`
takes them (`dp=2 lr<0.01`). The best run by the chosen metric is in bold. No business
logic: rows come from the caller."""
from __future__ import annotations

import math

from PySide6 import QtCore, QtGui, QtWidgets
from PySide6.QtCore import Qt

from engine.runs.history import LOWER_IS_BETTER, METRIC_COLUMNS, TEXT_COLUMNS, best_row, filter_rows

RAW = Qt.UserRole + 1  # the value itself, for sorting and tests
PATH = Qt.UserRole + 2

HEADERS = {"final_loss": "final loss", "best_loss": "best loss", "final_val_loss": "final val loss",
           "best_val_loss": "best val loss", "best_val_acc": "best val acc", "samples_per_s": "samples/s",
           "peak_mem_mb": "peak MB", "predicted_step_s": "predicted step s", "measured_step_s": "measured step s",
           "step_time_ratio": "measured/predicted", "cpu_pct_mean": "mean CPU %", "rss_mb_peak": "peak RSS MB",
           "gpu_util_pct_mean": "mean GPU %", "gpu_mem_mb_peak": "peak GPU MB", "down_s": "down s",
           "checkpoint_s": "checkpoint s", "layouts": "layout per attempt"}


def _text(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}" if math.isfinite(v) else str(v)
    return str(v)


class RunsModel(QtCore.QAbstractTableModel):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.rows: list[dict] = []
        self.columns: list[str] = []
        self.best_path: str | None = None

    def set_rows(self, rows: list[dict], settings: list[str]) -> None:
        self.beginResetModel()
        self.rows = list(rows)
        self.columns = ["run", "state", *settings, *METRIC_COLUMNS, *TEXT_COLUMNS, "step"]
        self.endResetModel()

    def value(self, row: int, col: int):
        r, key = self.rows[row], self.columns[col]
        if key in r.get("settings", {}) and key not in r:
            return r["settings"][key]
        return r.get(key)

    def rowCount(self, parent=QtCore.QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent=QtCore.QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.columns)

    def headerData(self, section, orientation, role=Qt.DisplayRole):
        if role == Qt.DisplayRole and orientation == Qt.Horizontal:
            return HEADERS.get(self.columns[section], self.columns[section])
        if role == Qt.ToolTipRole and orientation == Qt.Horizontal:
            return self.columns[section]
        return None

    def data(self, index, role=Qt.DisplayRole):
        if not index.isValid():
            return None
        v = self.value(index.row(), index.column())
        r = self.rows[index.row()]
        if role == Qt.DisplayRole:
            return _text(v)
        if role == RAW:
            return v
        if role == PATH:
            return r["path"]
        if role == Qt.ToolTipRole:
            return r["path"] if self.columns[index.column()] == "run" else _text(v)
        if role == Qt.FontRole and r["path"] == self.best_path:
            f = QtGui.QFont()
            f.setBold(True)
            return f
        if role == Qt.BackgroundRole and r["path"] == self.best_path:
            return QtGui.QBrush(QtGui.QColor(80, 160, 80, 60))
        if role == Qt.TextAlignmentRole and isinstance(v, (int, float)) and not isinstance(v, bool):
            return int(Qt.AlignRight | Qt.AlignVCenter)
        return None


class RunsProxy(QtCore.QSortFilterProxyModel):
    """Numbers sort as numbers (empty cells last); the filter is text or expressions."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setSortRole(RAW)
        self.exprs: list[str] = []
        self.text = ""

    def set_filter(self, text: str) -> str | None:
        """Apply the filter box; the reason when an expression cannot be read (nothing changes then)."""
        import re

        parts = text.split()
        exprs = [p for p in parts if re.match(r"^[\w.]+\s*(<=|>=|!=|==|=|<|>|~)", p)]
        words = [p for p in parts if p not in exprs]
        try:
            filter_rows([], exprs)
        except ValueError as exc:
            return str(exc).replace("--filter ", "filter ")
        self.exprs, self.text = exprs, " ".join(words).lower()
        self.invalidateFilter()
        return None

    def filterAcceptsRow(self, source_row, source_parent) -> bool:
        m = self.sourceModel()
        row = m.rows[source_row]
        if self.exprs and not filter_rows([row], self.exprs):
            return False
        if self.text:
            cells = " ".join(_text(m.value(source_row, c)) for c in range(len(m.columns))).lower()
            return all(w in cells for w in self.text.split())
        return True

    def lessThan(self, left, right) -> bool:
        a, b = left.data(RAW), right.data(RAW)
        if a is None or b is None:  # empty cells after every value, whichever the order
            asc = self.sortOrder() == Qt.AscendingOrder
            return (a is not None) if asc else (a is None and b is not None)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            return a < b
        return str(a) < str(b)


class RunsTable(QtWidgets.QWidget):
    """The table, its filter box and the metric that picks the best run.
    `selection_changed(paths)`: the selected runs' folders, in table order."""

    selection_changed = QtCore.Signal(list)
    metric_changed = QtCore.Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.model = RunsModel(self)
        self.proxy = RunsProxy(self)
        self.proxy.setSourceModel(self.model)
        self.filter_edit = QtWidgets.QLineEdit(placeholderText="filter: text, or dp=2 lr<0.01 state~stopped")
        self.filter_edit.textChanged.connect(self._filter)
        self.metric_box = QtWidgets.QComboBox()
        self.metric_box.addItems(list(METRIC_COLUMNS))
        self.metric_box.setCurrentText("best_val_loss")
        self.metric_box.currentTextChanged.connect(self._metric)
        self.message = QtWidgets.QLabel()
        self.view = QtWidgets.QTableView()
        self.view.setModel(self.proxy)
        self.view.setSortingEnabled(True)
        self.view.setSelectionBehavior(QtWidgets.QAbstractItemView.SelectRows)
        self.view.setSelectionMode(QtWidgets.QAbstractItemView.ExtendedSelection)
        self.view.verticalHeader().hide()
        self.view.horizontalHeader().setStretchLastSection(True)
        self.view.selectionModel().selectionChanged.connect(lambda *_: self.selection_changed.emit(self.selected()))
        top = QtWidgets.QHBoxLayout()
        top.addWidget(self.filter_edit, 1)
        top.addWidget(QtWidgets.QLabel("best by"))
        top.addWidget(self.metric_box)
        lay = QtWidgets.QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(top)
        lay.addWidget(self.message)
        lay.addWidget(self.view, 1)
        self.message.hide()

    # -- content ------------------------------------------------------------------------
    def set_rows(self, rows: list[dict]) -> None:
        """Show these runs (engine.runs.history.runs_table); the selection is kept by folder."""
        keep = set(self.selected())
        settings: list[str] = []
        for r in rows:
            for k, v in r.get("settings", {}).items():
                if k not in settings and any(x.get("settings", {}).get(k) is not None for x in rows):
                    settings.append(k)
        # a setting every run shares is noise in a comparison: columns for what differs (all when one run)
        varied = [k for k in settings if len({repr(r["settings"].get(k)) for r in rows}) > 1]
        self.model.set_rows(rows, varied if len(rows) > 1 and varied else settings)
        self._update_best()
        self.select_paths(keep)

    @property
    def metric(self) -> str:
        return self.metric_box.currentText()

    def set_metric(self, metric: str) -> None:
        self.metric_box.setCurrentText(metric)

    def best_path(self) -> str | None:
        return self.model.best_path

    def visible_rows(self) -> list[dict]:
        """The rows the filter lets through, in the table's order."""
        return [self.model.rows[self.proxy.mapToSource(self.proxy.index(i, 0)).row()] for i in range(self.proxy.rowCount())]

    def column_values(self, key: str) -> list:
        col = self.model.columns.index(key)
        return [self.proxy.index(i, col).data(RAW) for i in range(self.proxy.rowCount())]

    def sort_by(self, key: str, order=None) -> None:
        if order is None:
            order = Qt.AscendingOrder if key in LOWER_IS_BETTER else Qt.DescendingOrder
        self.view.sortByColumn(self.model.columns.index(key), order)

    def selected(self) -> list[str]:
        rows = sorted({i.row() for i in self.view.selectionModel().selectedRows()})
        return [self.proxy.index(r, 0).data(PATH) for r in rows]

    def select_paths(self, paths) -> None:
        paths = set(paths)
        sel = QtCore.QItemSelection()
        for i in range(self.proxy.rowCount()):
            if self.proxy.index(i, 0).data(PATH) in paths:
                sel.select(self.proxy.index(i, 0), self.proxy.index(i, self.proxy.columnCount() - 1))
        self.view.selectionModel().select(sel, QtCore.QItemSelectionModel.ClearAndSelect)

    # -- internals ---------------------------------------------------------------------------
    def _filter(self, text: str) -> None:
        err = self.proxy.set_filter(text)
        self.message.setText(err or "")
        self.message.setVisible(bool(err))
        self._update_best()

    def _metric(self, metric: str) -> None:
        self._update_best()
        self.metric_changed.emit(metric)

    def _update_best(self) -> None:
        best = best_row(self.visible_rows(), self.metric)
        self.model.best_path = best["path"] if best else None
        if self.model.rowCount():
            self.model.dataChanged.emit(self.model.index(0, 0),
                                        self.model.index(self.model.rowCount() - 1, self.model.columnCount() - 1))
