"""The devices panel: the mesh (pp x dp x tp) and pipeline stages as coloured lanes.

Edits are signals (the controller makes undo commands of them), and only edits the
model takes: the boxes offer what engine/project.py's Placement fields allow, and a
change the Placement refuses (pp x dp x tp over MAX_PROCESSES, say) is not sent; the box
goes back to the valid value and the panel says why. A plan from
engine/planning/planner.py, when one exists, is shown as text lines the controller hands in.
The "Devices" source (this machine or a cluster profile) is a choice the panel only
shows: app/devices_source.py probes the cluster and hands back lines to list.

The stage lanes show what the plan puts on each stage (the planner cuts the model itself
when nodes have no stage), in the user's terms: a block wholly on a stage by its name, a
block split by a cut as "name (fc1, act)"; the whole list is each lane's tooltip. The panel
scrolls when its dock is short, and the plan view scrolls inside it.
"""
from __future__ import annotations

from PySide6.QtCore import QEvent, QRectF, Qt, Signal
from PySide6.QtGui import QColor, QFontDatabase, QFontMetricsF, QPainter
from PySide6.QtWidgets import (QComboBox, QFormLayout, QFrame, QGridLayout, QHBoxLayout, QLabel, QPlainTextEdit,
                               QPushButton, QScrollArea, QSizePolicy, QSpinBox, QToolTip, QVBoxLayout, QWidget)

from engine.diagram.graph import TP_STYLES, block_name, block_path
from engine.project import Placement, PlacementError
from widgets.style import LIGHT, stage_color


LANES_SHOWN = 4  # lanes visible at once; more scroll
IO = ("Input", "Output")


def in_blocks(graph, ids: list[str]) -> list[str]:
    """Node ids as the user sees them: a block every layer of which is here by its name
    (the outermost such block), a collapsed block the cut splits as "name (fc1, act)" (or
    "name (5 of 9)"),
    other nodes by their ids; in the order given."""
    if graph is None:
        return list(ids)
    layers: dict[str, list[str]] = {}  # block -> its layers (nested blocks' too), in one pass
    for nid, node in graph.nodes.items():
        if node.type not in IO:
            for b in block_path(node.group):
                layers.setdefault(b, []).append(nid)
    here, out, seen = set(ids), [], set()
    for n in ids:
        node = graph.nodes.get(n)
        path = block_path(node.group) if node is not None else []
        whole = next((b for b in path if all(m in here for m in layers.get(b, ()))), None)
        card = graph.outermost_collapsed(n) if node is not None else None
        name = whole or card
        if name is None:
            out.append(n)
        elif name not in seen:
            seen.add(name)
            mine = [m for m in layers.get(name, ()) if m in here]
            out.append(block_name(name) if name == whole else f"{block_name(name)} ({', '.join(mine)})"
                       if len(mine) <= 3 else f"{block_name(name)} ({len(mine)} of {len(layers.get(name, ()))})")
    return out


class StageLanes(QWidget):
    """One lane per pipeline stage listing what it runs (the plan's stages when there is a
    plan for this pp; else the nodes assigned to it, plus 'auto' for unassigned), and the
    nodes left on a stage beyond pp."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.lanes: list[tuple[str, int | None, list[str]]] = []
        self.theme = LIGHT
        self.setMinimumHeight(60)
        self.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Minimum)

    def set_lanes(self, pp: int, dp: int, tp: int, nodes: dict, stages: list[list[str]] | None = None,
                  graph=None) -> None:
        """`stages`: the plan's node ids per stage (None: no plan for this placement)."""
        lanes = []
        if stages is not None:
            for s, ids in enumerate(stages):
                mine = [n for n in ids if n in nodes and nodes[n].stage is not None]
                how = "" if len(mine) == len(ids) else "  ·  planner's cut" if not mine else "  ·  yours + planner's"
                lanes.append((f"stage {s}  ·  {dp * tp} device(s){how}", s, in_blocks(graph, ids)))
        else:
            for s in range(pp):
                ids = [n for n, node in nodes.items() if node.stage == s]
                lanes.append((f"stage {s}  ·  {dp * tp} device(s)", s, in_blocks(graph, ids)))
            auto = [n for n, node in nodes.items() if node.stage is None]
            if auto:
                lanes.append(("auto (planner decides)", None, in_blocks(graph, auto)))
        beyond = [n for n, node in nodes.items() if node.stage is not None and node.stage >= max(pp, len(stages or []))]
        if beyond:
            lanes.append((f"stage ≥ {pp}: beyond pp={pp} (see Problems)", -1, in_blocks(graph, beyond)))
        self.lanes = lanes
        self.setMinimumHeight(max(60, 46 * len(lanes) + 4))
        self.update()

    def lane_text(self, i: int) -> str:
        """What lane i lists, in full (its painted line is elided)."""
        return ", ".join(self.lanes[i][2]) or "(empty)"

    def event(self, e) -> bool:
        if e.type() == QEvent.ToolTip:  # the lane under the pointer, in full
            i = int(e.pos().y() - 2) // 46
            if 0 <= i < len(self.lanes):
                QToolTip.showText(e.globalPos(), f"{self.lanes[i][0]}\n{self.lane_text(i)}", self)
            else:
                QToolTip.hideText()
            return True
        return super().event(e)

    def paintEvent(self, e) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.Antialiasing)
        fm = QFontMetricsF(self.font())
        y = 2.0
        for title, stage, ids in self.lanes:
            col = QColor(self.theme.error) if stage == -1 else stage_color(stage, self.theme)
            r = QRectF(2, y, self.width() - 4, 42)
            bg = QColor(col)
            bg.setAlpha(40)
            p.setPen(Qt.NoPen)
            p.setBrush(bg)
            p.drawRoundedRect(r, 6, 6)
            p.setBrush(col)
            p.drawRoundedRect(QRectF(r.x(), r.y(), 6, r.height()), 3, 3)
            p.setPen(QColor(self.theme.text))
            p.drawText(QRectF(r.x() + 12, r.y() + 2, r.width() - 16, 18), Qt.AlignLeft | Qt.AlignVCenter, title)
            p.setPen(QColor(self.theme.subtext))
            text = fm.elidedText(", ".join(ids) or "(empty)", Qt.ElideRight, r.width() - 20)  # (all: the tooltip)
            p.drawText(QRectF(r.x() + 12, r.y() + 20, r.width() - 16, 18), Qt.AlignLeft | Qt.AlignVCenter, text)
            y += 46


class SourceCombo(QComboBox):
    """Asks for a fresh list of sources just before it opens (profiles change elsewhere)."""
    about_to_open = Signal()

    def showPopup(self) -> None:
        self.about_to_open.emit()
        super().showPopup()


class DevicesPanel(QWidget):
    source_chosen = Signal(object)  # None: this machine; else a cluster profile name
    sources_wanted = Signal()  # the source list is about to open: refill it
    mesh_edited = Signal(str, object)  # placement field (pp/dp/tp/microbatches/schedule/...), value
    assign_requested = Signal(object)  # stage (int) or None: for the selected nodes
    tp_requested = Signal(object)  # TP style or None: for the selected nodes

    def __init__(self, parent=None):
        super().__init__(parent)
        self._updating = False
        self._placement: Placement | None = None  # the last placement shown: edits are checked against it
        self._tips: dict[str, str] = {}  # each editor's own tooltip, shown again once its edit is taken
        self.plan_of = lambda: None  # the plan shown (engine.planning.planner.Plan), set by app/devices_source.py attach
        self.graph_of = lambda: None  # the diagram (its blocks), likewise
        # everything in a scroll area: a short dock scrolls the panel instead of cutting the plan off
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        self.scroll = QScrollArea()
        self.scroll.setObjectName("devices_scroll")
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.NoFrame)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        outer.addWidget(self.scroll)
        page = QWidget()
        self.scroll.setWidget(page)
        lay = QVBoxLayout(page)
        lay.setContentsMargins(8, 6, 8, 6)
        src = QFormLayout()
        self.source = SourceCombo()
        self.source.setObjectName("devices_source")
        self.source.addItem("This machine", None)
        self.source.about_to_open.connect(self.sources_wanted)
        self.source.activated.connect(lambda i: self.source_chosen.emit(self.source.itemData(i)))
        src.addRow("Devices", self.source)
        lay.addLayout(src)
        self.device_list = QLabel()
        self.device_list.setObjectName("device_list")
        self.device_list.setWordWrap(True)
        self.device_list.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.device_list.hide()
        lay.addWidget(self.device_list)
        self.device_error = QLabel()
        self.device_error.setObjectName("error")
        self.device_error.setWordWrap(True)
        self.device_error.hide()
        lay.addWidget(self.device_error)
        grid = QGridLayout()
        self.spins: dict[str, QSpinBox] = {}
        for col, (key, label, tip) in enumerate((("pp", "pipeline", "pipeline stages"),
                                                 ("dp", "data", "data-parallel replicas"),
                                                 ("tp", "tensor", "tensor-parallel ways"))):
            s = QSpinBox()
            s.setRange(*Placement.bounds(key))  # the model's bounds; their product is checked on each edit
            s.setObjectName(key)
            s.setToolTip(tip)
            self._tips[key] = tip
            s.valueChanged.connect(lambda v, key=key: self._mesh(key, v))
            self.spins[key] = s
            grid.addWidget(QLabel(f"{label} ({key})"), 0, col)
            grid.addWidget(s, 1, col)
        lay.addLayout(grid)
        self.mesh_error = QLabel()  # why the last edit was refused
        self.mesh_error.setObjectName("error")
        self.mesh_error.setWordWrap(True)
        self.mesh_error.hide()
        lay.addWidget(self.mesh_error)
        form = QFormLayout()
        self.world = QLabel()
        form.addRow("devices", self.world)
        self.micro = QSpinBox()
        self.micro.setRange(0, Placement.bounds("microbatches")[1])
        self.micro.setObjectName("microbatches")
        self.micro.setSpecialValueText("auto")  # 0: the planner picks (at least one per stage)
        self._tips["microbatches"] = "micro-batches per step in a pipeline; auto: at least one per stage, dividing the batch"
        self.micro.setToolTip(self._tips["microbatches"])
        self.micro.valueChanged.connect(lambda v: self._mesh("microbatches", v or None))
        form.addRow("micro-batches", self.micro)
        self.schedule = QComboBox()
        self.schedule.addItems(list(Placement.choices("schedule")))
        self._tips["schedule"] = "the order in which pipeline stages run their micro-batches"
        self.schedule.setToolTip(self._tips["schedule"])
        self.schedule.currentTextChanged.connect(lambda v: self._mesh("schedule", v))
        form.addRow("pipeline schedule", self.schedule)
        self.dpmode = QComboBox()
        self.dpmode.addItems(list(Placement.choices("data_parallel")))
        self._tips["data_parallel"] = "ddp: each replica holds the whole model; fsdp: replicas shard it (FSDP2)"
        self.dpmode.setToolTip(self._tips["data_parallel"])
        self.dpmode.currentTextChanged.connect(lambda v: self._mesh("data_parallel", v))
        form.addRow("data parallel", self.dpmode)
        lay.addLayout(form)
        self.lanes = StageLanes()
        # many stages scroll within four lanes' height: the dock (and the window) keep their size
        self.lanes_scroll = QScrollArea()
        self.lanes_scroll.setObjectName("stage_lanes")
        self.lanes_scroll.setWidget(self.lanes)
        self.lanes_scroll.setWidgetResizable(True)
        self.lanes_scroll.setFrameShape(QFrame.NoFrame)
        self.lanes_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.lanes_scroll.setMaximumHeight(LANES_SHOWN * 46 + 6)
        lay.addWidget(self.lanes_scroll)
        row = QHBoxLayout()
        self.stage_combo = QComboBox()
        self.assign_btn = QPushButton("Assign selected")
        self.assign_btn.clicked.connect(lambda: self.assign_requested.emit(self.stage_combo.currentData()))
        row.addWidget(self.stage_combo, 1)
        row.addWidget(self.assign_btn)
        lay.addLayout(row)
        row = QHBoxLayout()
        self.tp_combo = QComboBox()
        self.tp_combo.addItem("auto", None)
        for s in TP_STYLES:
            self.tp_combo.addItem(s, s)
        self.tp_combo.addItem("pairs (Megatron, in a block)", "pairs")  # colwise -> rowwise inside it
        self.tp_combo.setToolTip("The tensor-parallel style of the selected nodes or blocks; a block passes it on\n"
                                 "to the layers it holds. 'pairs': Megatron's colwise/rowwise pairs inside it.")
        self.tp_btn = QPushButton("Set TP style")
        self.tp_btn.clicked.connect(lambda: self.tp_requested.emit(self.tp_combo.currentData()))
        row.addWidget(self.tp_combo, 1)
        row.addWidget(self.tp_btn)
        lay.addLayout(row)
        self.selection_label = QLabel()
        self.selection_label.setObjectName("hint")
        lay.addWidget(self.selection_label)
        self.plan_view = QPlainTextEdit(readOnly=True)
        self.plan_view.setLineWrapMode(QPlainTextEdit.NoWrap)
        font = QFontDatabase.systemFont(QFontDatabase.FixedFont)
        font.setPointSizeF(max(7.0, font.pointSizeF() - 1))
        self.plan_view.setFont(font)
        self.plan_view.setMinimumHeight(120)
        self.plan_view.hide()
        lay.addWidget(self.plan_view, 1)
        self._stretch = QWidget()
        lay.addWidget(self._stretch, 0)

    def editor(self, key: str) -> QWidget:
        """The box that edits placement field `key`."""
        return self.spins.get(key) or {"microbatches": self.micro, "schedule": self.schedule,
                                       "data_parallel": self.dpmode}[key]

    def _mesh(self, key: str, value) -> None:
        if self._updating:
            return
        before = self._placement
        if before is not None:
            try:
                after = before.derive(**{key: value})
            except PlacementError as exc:  # not sent: the box shows the valid value again, and why
                self._refuse(key, str(exc))
                return
            if after == before:  # the box settling on the value it shows (Return after a refusal): nothing new
                return
        self._say("")
        self.mesh_edited.emit(key, value)
        if self._placement is before and before is not None:  # nobody answered with set_state: follow the edit
            self._placement = after

    def _refuse(self, key: str, why: str) -> None:
        self._updating = True
        try:
            self._show_value(key, getattr(self._placement, key))
        finally:
            self._updating = False
        self._say(why, key)

    def _show_value(self, key: str, value) -> None:
        if key in self.spins:
            self.spins[key].setValue(value)
        elif key == "microbatches":
            self.micro.setValue(value or 0)
        else:
            self.editor(key).setCurrentText(value)

    def _say(self, why: str, key: str | None = None) -> None:
        """A refused edit: the reason under the mesh and in the box's tooltip; "": none."""
        self.mesh_error.setText(why)
        self.mesh_error.setVisible(bool(why))
        for k, tip in self._tips.items():
            self.editor(k).setToolTip(f"{tip}\n\nNot taken: {why}" if why and k == key else tip)

    def set_state(self, placement, nodes: dict, selected: list[str], plan_lines: list[str] | None = None) -> None:
        self._placement = placement
        self._updating = True
        try:
            for key in (*self.spins, "microbatches", "schedule", "data_parallel"):
                self._show_value(key, getattr(placement, key))
            self.world.setText(f"{placement.world}  (pp {placement.pp} × dp {placement.dp} × tp {placement.tp})")
            cur = self.stage_combo.currentData()
            self.stage_combo.clear()
            self.stage_combo.addItem("auto", None)
            for s in range(placement.pp):
                self.stage_combo.addItem(f"stage {s}", s)
            self.stage_combo.setCurrentIndex(max(0, self.stage_combo.findData(cur)))
        finally:
            self._updating = False
        plan = self.plan_of()
        run = getattr(plan, "run", None)
        fits = run is not None and (run.pp, run.dp, run.tp) == (placement.pp, placement.dp, placement.tp)
        self.lanes.set_lanes(placement.pp, placement.dp, placement.tp, nodes, run.stages if fits else None,
                             self.graph_of())
        # at least two lanes' height, up to LANES_SHOWN when there is room; the rest scrolls
        self.lanes_scroll.setMinimumHeight(min(self.lanes.minimumHeight(), 2 * 46 + 6))
        self.assign_btn.setEnabled(bool(selected))
        self.tp_btn.setEnabled(bool(selected))
        self.selection_label.setText(f"{len(selected)} node(s) selected" if selected else "select nodes to place them")
        if plan_lines:
            text = "\n".join(plan_lines)
            if text != self.plan_view.toPlainText():
                self.plan_view.setPlainText(text)
            self.plan_view.show()
        else:
            self.plan_view.hide()
        self._stretch.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Ignored if plan_lines else QSizePolicy.Expanding)

    def set_sources(self, names: list[str], current: str | None) -> None:
        """The choices: this machine, then each cluster profile by name."""
        self.source.blockSignals(True)
        try:
            self.source.clear()
            self.source.addItem("This machine", None)
            for n in names:
                self.source.addItem(n, n)
            self.source.setCurrentIndex(max(0, self.source.findData(current)))
        finally:
            self.source.blockSignals(False)

    def set_devices(self, lines: list[str], error: str | None = None) -> None:
        """The real devices (one line each) and a problem reaching them, if any."""
        self.device_list.setText("\n".join(lines))
        self.device_list.setVisible(bool(lines))
        self.device_error.setText(error or "")
        self.device_error.setVisible(bool(error))

    def set_theme(self, t) -> None:
        self.lanes.theme = t
        self.lanes.update()
