"""The Data panel: the user picks a folder or a file, and sees what the data set holds
(engine/data/inspection.py's report): samples per split, one sample's shapes and dtypes,
the classes and their histogram, example images (as the model sees them in validation,
and augmented as in training) or decoded token text, and the loader's samples/s.

The panel only shows: it asks (`chosen`, `fit_requested`) and is told (`show_busy`,
`show_info`, `show_report`, `show_error`). The inspection itself runs on a worker thread
(app/data_ui.py). `guess_kind` says which kind of data set a path looks like.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QImage, QPixmap
from PySide6.QtWidgets import (QComboBox, QFileDialog, QFormLayout, QGridLayout, QGroupBox, QHBoxLayout, QLabel,
                               QLineEdit, QPlainTextEdit, QProgressBar, QPushButton, QScrollArea, QSizePolicy,
                               QVBoxLayout, QWidget)

KINDS = ("image_folder", "token_file", "parquet", "array", "shards")
KIND_LABELS = {"": "guess from the path", "image_folder": "image folder (one subfolder per class)",
               "token_file": "token file (.bin)", "parquet": "Parquet / Arrow columns",
               "array": "NumPy arrays (.npz, .npy)", "shards": "tar shards"}
IMAGE_EXT = {".jpg", ".jpeg", ".png", ".webp", ".bmp"}
THUMB = 64  # px: the side of an example image in the grid
SCAN = 200  # entries of a folder looked at when guessing: a huge folder is not listed whole


def _entries(folder: Path, limit: int = SCAN) -> list[Path]:
    out = []
    try:
        with os.scandir(folder) as it:
            for e in it:
                out.append(Path(e.path))
                if len(out) >= limit:
                    break
    except OSError:
        pass
    return out


def guess_kind(path: str | Path) -> str | None:
    """The kind of data set a path looks like, or None: a folder of class subfolders
    (or train/ and val/ of them) -> image_folder, *.bin -> token_file, *.parquet/*.arrow
    -> parquet, *.npy/*.npz -> array, *.tar shards -> shards."""
    p = Path(path)
    if p.is_file():
        return {".bin": "token_file", ".parquet": "parquet", ".arrow": "parquet", ".npz": "array",
                ".npy": "array", ".tar": "shards"}.get(p.suffix.lower())
    if not p.is_dir():
        return "shards" if "{" in p.name and p.name.endswith(".tar") else None  # s-{000..099}.tar
    entries = _entries(p)
    suffixes = {e.suffix.lower() for e in entries if e.is_file()}
    for ext, kind in ((".bin", "token_file"), (".tar", "shards"), (".parquet", "parquet"), (".arrow", "parquet"),
                      (".npy", "array")):
        if ext in suffixes:
            return kind
    dirs = [e for e in entries if e.is_dir() and not e.name.startswith(".")]
    train = p / "train"
    if train.is_dir():
        return guess_kind(train)
    for d in dirs[:8]:  # class subfolders holding images
        if any(e.suffix.lower() in IMAGE_EXT for e in _entries(d, 50)):
            return "image_folder"
    return None


def _image(a: np.ndarray) -> QPixmap:
    """An (H, W, C) uint8 array as a pixmap (a copy: the array may go away)."""
    a = np.ascontiguousarray(a)
    if a.ndim == 3 and a.shape[2] == 1:
        a = np.ascontiguousarray(a[:, :, 0])
    h, w = a.shape[:2]
    if a.ndim == 2:
        img = QImage(a.data, w, h, a.strides[0], QImage.Format_Grayscale8)
    else:
        img = QImage(a.data, w, h, a.strides[0], QImage.Format_RGB888)
    return QPixmap.fromImage(img.copy())


def _shape(spec: dict) -> str:
    if "shape" in spec:
        return f"{list(spec['shape'])} {spec.get('dtype', '')}".strip()
    return ", ".join(f"{k} {_shape(v)}" for k, v in spec.items())  # several named inputs


def _count(n) -> str:
    return f"{n:,}" if isinstance(n, int) else str(n)


class DataPanel(QWidget):
    chosen = Signal(str, str)  # path, kind ("" to guess from the path)
    fit_requested = Signal()  # make the Input node(s) take the data's shape and dtype

    def __init__(self, parent=None):
        super().__init__(parent)
        self.directory = Path.cwd  # where dialogs start: the project's folder
        self.report: dict | None = None
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        scroll = QScrollArea(widgetResizable=True)
        scroll.setFrameShape(QScrollArea.NoFrame)
        outer.addWidget(scroll)
        page = QWidget()
        lay = QVBoxLayout(page)
        lay.setContentsMargins(8, 6, 8, 8)
        scroll.setWidget(page)

        pick = QGroupBox("Data set")
        form = QVBoxLayout(pick)
        self.path_edit = QLineEdit()
        self.path_edit.setObjectName("data_path")
        self.path_edit.setPlaceholderText("a folder or file of samples")
        self.path_edit.editingFinished.connect(self._typed)
        form.addWidget(self.path_edit)
        row = QHBoxLayout()
        self.folder_button = QPushButton("Folder…")
        self.folder_button.setToolTip("an image folder (one subfolder per class), a folder of .bin, .npy, .tar or .parquet files")
        self.folder_button.clicked.connect(self.browse_folder)
        self.file_button = QPushButton("File…")
        self.file_button.setToolTip("a token file (.bin), Parquet/Arrow file, .npz/.npy or .tar shard")
        self.file_button.clicked.connect(self.browse_file)
        self.kind_combo = QComboBox()
        self.kind_combo.setObjectName("data_kind")
        for k, text in KIND_LABELS.items():
            self.kind_combo.addItem(text, k)
        self.kind_combo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.kind_combo.setMinimumContentsLength(8)
        self.kind_combo.setToolTip("the kind of data set; guessed from the path unless chosen here")
        self.kind_combo.activated.connect(self._kind_picked)
        row.addWidget(self.folder_button)
        row.addWidget(self.file_button)
        row.addWidget(self.kind_combo, 1)
        form.addLayout(row)
        lay.addWidget(pick)

        self.progress = QProgressBar()
        self.progress.setRange(0, 0)  # busy
        self.progress.setTextVisible(False)
        self.progress.setMaximumHeight(6)
        self.progress.hide()
        self.status = QLabel("Pick a folder or a file to see what it holds.")
        self.status.setObjectName("hint")
        self.status.setWordWrap(True)
        self.error = QLabel()
        self.error.setObjectName("error")
        self.error.setWordWrap(True)
        self.error.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.error.hide()
        for w in (self.progress, self.status, self.error):
            lay.addWidget(w)

        self.summary_box = QGroupBox("Samples")
        self.summary = QFormLayout(self.summary_box)
        self.summary.setFieldGrowthPolicy(QFormLayout.AllNonFixedFieldsGrow)
        self.fields: dict[str, QLabel] = {}
        for key, label in (("samples", "train / val"), ("x", "input"), ("y", "target"), ("task", "task"),
                           ("classes", "classes"), ("speed", "loader")):
            v = QLabel()
            v.setObjectName(f"data_{key}")
            v.setWordWrap(True)
            v.setTextInteractionFlags(Qt.TextSelectableByMouse)
            self.summary.addRow(label, v)
            self.fields[key] = v
        fit_row = QHBoxLayout()
        self.fit_label = QLabel()
        self.fit_label.setWordWrap(True)
        self.fit_button = QPushButton("Set Input")
        self.fit_button.setObjectName("fit_input")
        self.fit_button.setToolTip("set the Input node's shape and dtype to the data set's (one undo step)")
        self.fit_button.clicked.connect(self.fit_requested)
        fit_row.addWidget(self.fit_label, 1)
        fit_row.addWidget(self.fit_button)
        self.fit_widget = QWidget()
        self.fit_widget.setLayout(fit_row)
        fit_row.setContentsMargins(0, 0, 0, 0)
        self.summary.addRow(self.fit_widget)
        self.fit_widget.hide()
        lay.addWidget(self.summary_box)

        self.hist_box = QGroupBox("Classes")
        hl = QVBoxLayout(self.hist_box)
        import pyqtgraph as pg

        self.hist = pg.PlotWidget()
        self.hist.setObjectName("histogram")
        self.hist.setMinimumHeight(140)
        self.hist.setMaximumHeight(180)
        self.hist.setMenuEnabled(False)
        self.hist.setMouseEnabled(False, False)
        self.hist.hideButtons()
        self.hist.getPlotItem().setLabel("left", "samples")
        self.bars = None
        hl.addWidget(self.hist)
        self.hist_note = QLabel()
        self.hist_note.setObjectName("hint")
        self.hist_note.setWordWrap(True)
        hl.addWidget(self.hist_note)
        lay.addWidget(self.hist_box)

        self.examples_box = QGroupBox("Examples")
        el = QVBoxLayout(self.examples_box)
        self.grid = QGridLayout()
        self.grid.setSpacing(4)
        el.addLayout(self.grid)
        self.thumbs: list[QLabel] = []
        self.text = QPlainTextEdit()
        self.text.setObjectName("token_text")
        self.text.setReadOnly(True)
        self.text.setMinimumHeight(120)
        self.text.hide()
        el.addWidget(self.text)
        lay.addWidget(self.examples_box)
        lay.addStretch(1)
        self._show_parts(False)

    # ----- asking -----------------------------------------------------------------
    def kind(self) -> str:
        return self.kind_combo.currentData() or ""

    def set_kind(self, kind: str) -> None:
        i = self.kind_combo.findData(kind or "")
        self.kind_combo.setCurrentIndex(max(i, 0))

    def browse_folder(self) -> None:
        chosen = QFileDialog.getExistingDirectory(self, "Data set folder", self._start())
        if chosen:
            self.choose(chosen)

    def browse_file(self) -> None:
        chosen, _ = QFileDialog.getOpenFileName(
            self, "Data set file", self._start(),
            "Data sets (*.bin *.parquet *.arrow *.npz *.npy *.tar);;All files (*)")
        if chosen:
            self.choose(chosen)

    def _start(self) -> str:
        text = self.path_edit.text().strip()
        p = Path(text).expanduser() if text else self.directory()
        p = p if p.is_absolute() else self.directory() / p
        return str(p if p.exists() else self.directory())

    def choose(self, path: str, kind: str | None = None) -> None:
        """Use this path (as a dialog would): the kind chosen, else guessed."""
        if kind is not None:
            self.set_kind(kind)
        self.path_edit.setText(str(path))
        self.chosen.emit(str(path), self.kind())

    def _typed(self) -> None:
        text = self.path_edit.text().strip()
        if text and self.path_edit.isModified():
            self.path_edit.setModified(False)
            self.chosen.emit(text, self.kind())

    def _kind_picked(self, *_) -> None:
        text = self.path_edit.text().strip()
        if text:
            self.chosen.emit(text, self.kind())

    # ----- being told -------------------------------------------------------------
    def set_path(self, text: str, kind: str = "") -> None:
        """The project's data set (its path as written, its kind), without asking anything."""
        if not self.path_edit.hasFocus():
            self.path_edit.setText(text)
        self.set_kind(kind)

    def show_idle(self, text: str) -> None:
        """Nothing to inspect (a generated data set, no path yet)."""
        self.report = None
        self.progress.hide()
        self.error.hide()
        self.status.setText(text)
        self.status.show()
        self._show_parts(False)

    def show_busy(self, text: str) -> None:
        self.progress.show()
        self.error.hide()
        self.status.setText(text)
        self.status.show()

    def show_error(self, text: str) -> None:
        self.progress.hide()
        self.status.hide()
        self.error.setText(text)
        self.error.show()
        self._show_parts(False)

    def show_info(self, info) -> None:
        """engine.data.describe.DataInfo, the first (quick) part: counts, shapes, task."""
        self.error.hide()
        self.summary_box.show()
        self.fields["samples"].setText(f"{_count(info.n_train)} / {_count(info.n_val)}")
        if info.inputs:
            self.fields["x"].setText(", ".join(f"{k} {list(s)} {d}" for k, (s, d) in info.inputs.items()))
        else:
            self.fields["x"].setText(f"{list(info.sample_shape)} {info.x_dtype}")
        self.fields["task"].setText(info.task.replace("_", " "))
        vocab = info.task == "language_model"
        self.summary.labelForField(self.fields["classes"]).setText("vocabulary" if vocab else "classes")
        self.fields["classes"].setText(_count(info.n_classes) if info.n_classes else "—")

    def show_fit(self, text: str | None) -> None:
        """How the diagram's Input differs from the data (None: it fits)."""
        self.fit_widget.setVisible(bool(text))
        self.fit_label.setText(text or "")

    def show_report(self, report: dict) -> None:
        """engine.data.inspection.inspect_source's report, the whole of it."""
        self.report = report
        self.progress.hide()
        self.status.hide()
        self.error.hide()
        self.summary_box.show()
        s = report["samples"]
        self.fields["samples"].setText(f"{_count(s['train'])} / {_count(s['val'])}")
        spec = report["spec"]
        self.fields["x"].setText(_shape(spec["x"]))
        self.fields["y"].setText(_shape(spec["y"]) if isinstance(spec.get("y"), dict) else str(spec.get("y", "—")))
        self.fields["task"].setText(str(report.get("task", "")).replace("_", " "))
        if "vocab_size" in report:
            self.summary.labelForField(self.fields["classes"]).setText("vocabulary")
            toks = report.get("tokens") or {}
            self.fields["classes"].setText(
                f"{_count(report['vocab_size'])} ({report['dtype']}); tokens {_count(toks.get('train'))} / "
                f"{_count(toks.get('val'))}; window {report['seq_len']}")
        else:
            self.summary.labelForField(self.fields["classes"]).setText("classes")
            self.fields["classes"].setText(_count(report["n_classes"]) if report.get("n_classes") else "—")
        tp = report.get("throughput") or {}
        skipped = f", {tp['skipped']} skipped" if tp.get("skipped") else ""
        self.fields["speed"].setText(
            f"{tp.get('samples_per_s', 0):,.0f} samples/s (batch {tp.get('batch_size')}, {tp.get('workers')} workers; "
            f"first batch {tp.get('first_batch_s', 0):.2f} s){skipped}")
        self._histogram(report)
        self._examples(report)

    # ----- drawing ----------------------------------------------------------------
    def _show_parts(self, on: bool) -> None:
        for box in (self.summary_box, self.hist_box, self.examples_box):
            box.setVisible(on)

    def _histogram(self, report: dict) -> None:
        import pyqtgraph as pg

        h = report.get("histogram")
        self.hist_box.setVisible(bool(h))
        if not h:
            return
        counts = h["counts"]
        names = report.get("classes") or [str(i) for i in range(len(counts))]
        plot = self.hist.getPlotItem()
        if self.bars is not None:
            plot.removeItem(self.bars)
        self.bars = pg.BarGraphItem(x=np.arange(len(counts)), height=np.asarray(counts, float), width=0.8,
                                    brush=pg.mkBrush(74, 144, 226), pen=pg.mkPen(None))
        plot.addItem(self.bars)
        step = max(1, len(counts) // 12)  # at most about a dozen names under the bars
        ticks = [(i, str(names[i])[:10]) for i in range(0, len(counts), step)]
        plot.getAxis("bottom").setTicks([ticks, []])
        plot.setXRange(-0.6, len(counts) - 0.4, padding=0)
        plot.setYRange(0, max(counts + [1]) * 1.1, padding=0)
        lo, hi = (min(counts), max(counts)) if counts else (0, 0)
        note = f"{len(counts)} classes, {lo:,} to {hi:,} samples each"
        if h.get("sampled"):
            note += f" (the first {h['rows']:,} samples)"
        if counts and lo == 0:
            empty = [str(names[i]) for i, c in enumerate(counts) if c == 0]
            note += f"; none of {', '.join(empty[:5])}"
        self.hist_note.setText(note)

    def _examples(self, report: dict) -> None:
        while self.grid.count():
            w = self.grid.takeAt(0).widget()
            if w is not None:
                w.deleteLater()
        self.thumbs = []
        exs = report.get("examples") or []
        images = [e for e in exs if e.get("image") is not None]
        self.text.setVisible(not images)
        self.examples_box.show()
        if images:
            self.examples_box.setTitle("Examples: as the model sees them, and augmented")
            cols = len(images)
            for r, (key, label) in enumerate((("image", "plain"), ("image_augmented", "augmented"))):
                tag = QLabel(label)
                tag.setObjectName("hint")
                self.grid.addWidget(tag, 2 * r, 0, 1, cols)
                for c, e in enumerate(images):
                    lab = QLabel()
                    lab.setFixedSize(THUMB, THUMB)
                    lab.setAlignment(Qt.AlignCenter)
                    lab.setSizePolicy(QSizePolicy.Fixed, QSizePolicy.Fixed)
                    lab.setPixmap(_image(e[key]).scaled(THUMB, THUMB, Qt.KeepAspectRatio, Qt.SmoothTransformation))
                    names = report.get("classes")
                    y = e.get("y")
                    cls = int(y) if y is not None and np.ndim(y) == 0 else None
                    name = names[cls] if names and cls is not None and cls < len(names) else cls
                    lab.setToolTip(f"{e.get('where', '')}" + (f"\nclass {name}" if name is not None else ""))
                    lab.setObjectName(f"thumb_{key}")
                    self.grid.addWidget(lab, 2 * r + 1, c)
                    self.thumbs.append(lab)
            return
        texts = [e.get("text") for e in exs if e.get("text")]
        if "vocab_size" in report:
            self.examples_box.setTitle("Examples: token windows, decoded")
            if texts:
                self.text.setPlainText("\n\n———\n\n".join(t[:600] for t in texts[:3]))
            else:  # no tokenizer to decode with: the ids
                ids = [np.asarray(e["x"]).ravel()[:48].tolist() for e in exs[:3]]
                self.text.setPlainText("no tokenizer.json beside the files: token ids\n\n"
                                       + "\n\n".join(" ".join(map(str, i)) for i in ids))
            return
        self.examples_box.setTitle("Examples")
        lines = []
        for e in exs[:4]:
            x = e["x"]
            xs = {k: np.asarray(v) for k, v in x.items()} if isinstance(x, dict) else {"x": np.asarray(x)}
            parts = [f"{k} {np.array2string(v.ravel()[:8], precision=3, separator=' ')}"
                     + ("…" if v.size > 8 else "") for k, v in xs.items()]
            lines.append(f"#{e['index']}: " + "; ".join(parts) + f" -> y {np.asarray(e['y']).ravel()[:8].tolist()}")
        self.text.setPlainText("\n".join(lines))
