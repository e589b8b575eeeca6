"""Editors for the selected node, built from its layer's parameter declarations.

int -> spin box (range from the declaration; "auto" for sizes inferred from the
input), float/ints/int2/json/str -> text fields parsed on Enter (int2: "3" or "3, 5"), choice -> combo,
bool -> check box. A value that does not parse, and every compile error naming a
field, is shown in red under that field. Edits are reported as signals; the
inspector never changes the model itself.
"""
from __future__ import annotations

import json
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFormLayout, QLabel, QLineEdit, QScrollArea, QSpinBox,
                               QVBoxLayout, QWidget)

from engine.diagram.graph import TP_STYLES
from engine.diagram.catalog import ParamSpec, get_layer

AUTO = "auto"
_BIG = 2**31 - 1


def _fmt(spec: ParamSpec, value: Any) -> str:
    if value is None:
        return ""
    if spec.kind in ("ints", "int2") and isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    if spec.kind in ("json", "list"):
        return json.dumps(value)
    if spec.kind == "float":
        return f"{value:g}"
    return str(value)


def parse(spec: ParamSpec, text: str) -> Any:
    """Text of a field -> value; raises ValueError with a message for the user."""
    text = text.strip()
    if text == "" and (spec.inferred or spec.optional):
        return None
    if spec.kind == "float":
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{spec.name} must be a number, e.g. 0.1") from None
    if spec.kind == "ints":
        try:
            return [int(s) for s in text.replace("[", "").replace("]", "").replace(",", " ").split()]
        except ValueError:
            raise ValueError(f"{spec.name} must be integers separated by commas, e.g. 1, 28, 28") from None
    if spec.kind == "int2":
        try:
            v = [int(s) for s in text.replace("[", "").replace("]", "").replace(",", " ").split()]
        except ValueError:
            v = []
        if len(v) not in (1, 2):
            raise ValueError(f"{spec.name} must be one integer or two (height, width), e.g. 3 or 3, 5")
        return v[0] if len(v) == 1 else v
    if spec.kind in ("json", "list"):
        try:
            v = json.loads(text or ("{}" if spec.kind == "json" else "[]"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{spec.name}: not valid JSON ({e.msg} at column {e.colno})") from None
        if spec.kind == "json" and not isinstance(v, dict):
            raise ValueError(f"{spec.name} must be a JSON object such as {{\"inplace\": true}}")
        if spec.kind == "list" and not isinstance(v, list):
            raise ValueError(f"{spec.name} must be a JSON list, e.g. the calls of an Op node")
        return v
    return text


class Inspector(QWidget):
    param_edited = Signal(str, str, object)  # node, key, value (None: back to default/auto)
    assignment_edited = Signal(str, str, object)  # node, stage|tp|checkpoint (its NodeAssignment), value
    rename_requested = Signal(str, str)  # old, new

    def __init__(self, parent=None):
        super().__init__(parent)
        self.graph = None
        self.node_id: str | None = None
        self.editors: dict[str, QWidget] = {}
        self.error_labels: dict[str, QLabel] = {}
        self._updating = False
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        self.scroll = QScrollArea(widgetResizable=True)
        self.scroll.setFrameShape(QScrollArea.NoFrame)
        outer.addWidget(self.scroll)
        self._page = None
        self.show_node(None, None)

    # ----- building -----------------------------------------------------------
    def show_node(self, graph, node_id: str | None, result=None) -> None:
        self.graph, self.node_id = graph, node_id
        self.editors, self.error_labels = {}, {}
        page = QWidget()
        lay = QVBoxLayout(page)
        lay.setContentsMargins(10, 8, 10, 8)
        if graph is None or node_id not in graph.nodes:
            hint = QLabel("Select a node to edit its parameters.\n\nDrag layers from the palette, or press Tab on the canvas.")
            hint.setWordWrap(True)
            hint.setObjectName("hint")
            lay.addWidget(hint)
            lay.addStretch(1)
            self._set_page(page)
            return
        node = graph.nodes[node_id]
        spec = get_layer(node.type)
        title = QLabel(f"<b>{node.type}</b>")
        lay.addWidget(title)
        if spec is not None:
            doc = QLabel(spec.doc)
            doc.setWordWrap(True)
            doc.setObjectName("doc")
            lay.addWidget(doc)
        self.info = QLabel()
        self.info.setObjectName("hint")
        self.info.setWordWrap(True)
        lay.addWidget(self.info)
        self.node_errors = QLabel()
        self.node_errors.setObjectName("error")
        self.node_errors.setWordWrap(True)
        self.node_errors.hide()
        lay.addWidget(self.node_errors)
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.AllNonFixedFieldsGrow)
        lay.addLayout(form)
        name = QLineEdit(node_id)
        name.setObjectName("name")
        name.editingFinished.connect(lambda: self._rename(name))
        self.editors["__name__"] = name
        self._row(form, "name", name, "the node's name: a Python identifier, used in error messages and plans")
        for ps in (spec.params if spec else ()):
            self._row(form, ps.name, self._editor(ps, node.params.get(ps.name, ps.default)), ps.doc)
        # the node's assignment (engine.diagram.graph.NodeAssignment); the project's placement is the Devices panel's
        sep = QLabel("<b>Assignment</b>")
        sep.setToolTip("where this node runs: its pipeline stage and tensor-parallel style\n"
                       "(the mesh itself, pp × dp × tp, is set in the Devices panel)")
        lay.addWidget(sep)
        pform = QFormLayout()
        lay.addLayout(pform)
        stage = QSpinBox()
        stage.setRange(-1, 63)
        stage.setSpecialValueText(AUTO)
        stage.setValue(-1 if node.stage is None else node.stage)
        stage.valueChanged.connect(lambda v: self._emit_assignment("stage", None if v < 0 else v))
        self.editors["__stage__"] = stage
        self._row(pform, "stage", stage, "pipeline stage (auto: the planner decides)")
        tp = QComboBox()
        styles = (spec.tp_styles if spec and spec.tp_styles else ()) or ()
        tp.addItem(AUTO, None)
        for s in TP_STYLES:
            if s in styles or s == node.tp:
                tp.addItem(s, s)
        tp.setCurrentIndex(max(0, tp.findData(node.tp)))
        tp.setEnabled(bool(styles))
        tp.currentIndexChanged.connect(lambda i: self._emit_assignment("tp", tp.itemData(i)))
        self.editors["__tp__"] = tp
        self._row(pform, "tensor parallel", tp, "how this layer is split across the tp devices")
        ck = QCheckBox("recompute in backward")
        ck.setChecked(node.checkpoint)
        ck.toggled.connect(lambda v: self._emit_assignment("checkpoint", bool(v)))
        self.editors["__checkpoint__"] = ck
        self._row(pform, "checkpoint", ck, "activation checkpointing: less memory, more compute")
        lay.addStretch(1)
        self._set_page(page)
        self.set_result(result)

    def _set_page(self, page: QWidget) -> None:
        self._page = page
        self.scroll.setWidget(page)

    def _row(self, form: QFormLayout, label: str, editor: QWidget, doc: str) -> None:
        box = QWidget()
        v = QVBoxLayout(box)
        v.setContentsMargins(0, 0, 0, 0)
        v.setSpacing(1)
        v.addWidget(editor)
        err = QLabel()
        err.setObjectName("error")
        err.setWordWrap(True)
        err.hide()
        v.addWidget(err)
        self.error_labels[label] = err
        lab = QLabel(label)
        lab.setToolTip(doc)
        editor.setToolTip(doc)
        form.addRow(lab, box)

    def _editor(self, ps: ParamSpec, value: Any) -> QWidget:
        if ps.kind == "int":
            w = QSpinBox()
            lo = int(ps.min) if ps.min is not None else -_BIG
            hi = int(ps.max) if ps.max is not None else _BIG
            nullable = ps.inferred or ps.optional
            w.setRange(lo - 1 if nullable else lo, hi)
            if nullable:
                w.setSpecialValueText(AUTO)
            w.setValue(lo - 1 if value is None else int(value))
            w.setKeyboardTracking(False)  # typed digits commit on Enter, arrows at once
            w.valueChanged.connect(lambda v, ps=ps, w=w: self._emit_param(ps.name, None if (ps.inferred or ps.optional) and v == w.minimum() else v))
        elif ps.kind == "bool":
            w = QCheckBox()
            w.setChecked(bool(value))
            w.toggled.connect(lambda v, ps=ps: self._emit_param(ps.name, bool(v)))
        elif ps.kind == "choice":
            w = QComboBox()
            for c in ps.choices:
                w.addItem(str(c), c)
            w.setCurrentIndex(max(0, w.findData(value)))
            w.currentIndexChanged.connect(lambda i, ps=ps, w=w: self._emit_param(ps.name, w.itemData(i)))
        else:
            w = QLineEdit(_fmt(ps, value))
            if ps.inferred or ps.optional:
                w.setPlaceholderText(AUTO)
            w.editingFinished.connect(lambda ps=ps, w=w: self._text_edited(ps, w))
        w.setObjectName(ps.name)
        self.editors[ps.name] = w
        return w

    # ----- edits out ----------------------------------------------------------
    def _emit_param(self, key: str, value: Any) -> None:
        if not self._updating and self.node_id:
            self.param_edited.emit(self.node_id, key, value)

    def _emit_assignment(self, key: str, value: Any) -> None:
        if not self._updating and self.node_id:
            self.assignment_edited.emit(self.node_id, key, value)

    @property
    def placement_edited(self):
        """assignment_edited under its older name (app/main_window.py connects it)."""
        return self.assignment_edited

    def _text_edited(self, ps: ParamSpec, w: QLineEdit) -> None:
        if self._updating or not self.node_id:
            return
        try:
            value = parse(ps, w.text())
        except ValueError as e:
            self._show_error(ps.name, str(e))
            return
        self._show_error(ps.name, "")
        current = self.graph.nodes[self.node_id].params.get(ps.name, ps.default)
        if value != current:
            self._emit_param(ps.name, value)

    def _rename(self, w: QLineEdit) -> None:
        new = w.text().strip()
        if self.node_id and new and new != self.node_id and not self._updating:
            self.rename_requested.emit(self.node_id, new)

    def _show_error(self, key: str, message: str) -> None:
        lab = self.error_labels.get(key)
        if lab is not None:
            lab.setText(message)
            lab.setVisible(bool(message))

    # ----- model in -----------------------------------------------------------
    def refresh_values(self) -> None:
        """Put the model's current values into the editors (after undo, say)."""
        if self.graph is None or self.node_id not in self.graph.nodes:
            return
        node = self.graph.nodes[self.node_id]
        spec = get_layer(node.type)
        self._updating = True
        try:
            for ps in (spec.params if spec else ()):
                w = self.editors.get(ps.name)
                v = node.params.get(ps.name, ps.default)
                if isinstance(w, QSpinBox):
                    w.setValue(w.minimum() if v is None else int(v))
                elif isinstance(w, QCheckBox):
                    w.setChecked(bool(v))
                elif isinstance(w, QComboBox):
                    w.setCurrentIndex(max(0, w.findData(v)))
                elif isinstance(w, QLineEdit) and not w.hasFocus():
                    w.setText(_fmt(ps, v))
            self.editors["__stage__"].setValue(-1 if node.stage is None else node.stage)
            tp = self.editors["__tp__"]
            tp.setCurrentIndex(max(0, tp.findData(node.tp)))
            self.editors["__checkpoint__"].setChecked(node.checkpoint)
        finally:
            self._updating = False

    def set_result(self, result) -> None:
        """Inline errors from the compile, and inferred sizes as 'auto (64)'."""
        if self.graph is None or self.node_id not in self.graph.nodes:
            return
        for key in self.error_labels:
            self._show_error(key, "")
        errs = result.errors_for(self.node_id) if result else []
        general = []
        for e in errs:
            if e.field and e.field in self.error_labels:
                self._show_error(e.field, str(e))
            else:
                general.append(str(e))
        self.node_errors.setText("\n".join(general))
        self.node_errors.setVisible(bool(general))
        info = result.nodes.get(self.node_id) if result else None
        from widgets.style import human

        parts = []
        if info is not None and info.out is not None:
            parts.append(f"out {info.out.label()} {info.out.dtype}")
        if info is not None and info.n_params:
            parts.append(f"{info.n_params:,} params")
        if info is not None and info.flops:
            parts.append(f"{human(info.flops)} FLOPs/sample")
        self.info.setText("  ·  ".join(parts))
        spec = get_layer(self.graph.nodes[self.node_id].type)
        for ps in (spec.params if spec else ()):
            if not ps.inferred:
                continue
            w = self.editors.get(ps.name)
            resolved = info.params.get(ps.name) if info else None
            text = f"{AUTO} ({resolved})" if resolved is not None else AUTO
            if isinstance(w, QSpinBox):
                w.setSpecialValueText(text)
            elif isinstance(w, QLineEdit):
                w.setPlaceholderText(text)
