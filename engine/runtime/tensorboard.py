"""TensorBoard event files of a run, written as it trains, so `tensorboard --logdir runs/`
(and W&B's TensorBoard sync) read it: rank 0 writes them into the run folder itself
(events.out.tfevents.*; TensorBoard names the run after the folder, and a cluster run
brings them back with the folder).

    scalars   the numbers of the metrics.jsonl records (records.record_scalars: loss,
              val_loss, val_acc, lr, samples_per_s, peak_mem_mb, ...) at their step;
              the first compile's seconds as compile_seconds
    hparams   the run's settings (records.run_settings: training.optimizer.lr,
              plan.dp, ...), through tensorboard.plugins.hparams, so the HPARAMS tab
              lists runs beside their loss and validation metrics

torch.utils.tensorboard (which needs the tensorboard package, an optional extra) is
imported here, lazily, when a run opens its writer: without it the run says so in
one log line and trains on. A resumed run purges the events after its checkpoint's
step (SummaryWriter's purge_step), as metrics.jsonl is cut back. $LAYERFLOW_TENSORBOARD=0
turns the files off.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

from .records import record_scalars, run_settings

ENV = "LAYERFLOW_TENSORBOARD"  # 0: no event files
HPARAM_METRICS = ("loss", "val_loss", "val_acc")  # the HPARAMS tab's metric columns (scalar tags)
MISSING = ("TensorBoard files not written: the tensorboard package is not installed "
           "(pip install 'layerflow[tensorboard]'); training goes on")


def _say(log, msg: str) -> None:
    try:
        log(msg)
    except OSError:  # the log is on a full disk
        pass


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


class TensorBoardLog:
    """The run's event files (rank 0's). `open` returns None when TensorBoard is not
    installed (having logged why once) or turned off."""

    def __init__(self, writer, settings: dict):
        self.writer = writer
        self.settings = settings

    @classmethod
    def open(cls, run_dir: str | Path, run_json: dict, start: int = 0, log=print,
             flush_secs: int = 10) -> TensorBoardLog | None:
        if not enabled():
            return None
        try:
            from torch.utils.tensorboard import SummaryWriter
            from torch.utils.tensorboard.summary import hparams
        except ImportError:
            _say(log, MISSING)
            return None
        except Exception as exc:  # noqa: BLE001 - a tensorboard that does not import here (protobuf versions)
            _say(log, f"TensorBoard files not written: importing it failed ({type(exc).__name__}: {exc}); "
                      "training goes on")
            return None
        # (TensorBoard drops the events at and after purge_step: the checkpoint's own step was logged before it)
        try:
            writer = SummaryWriter(log_dir=str(run_dir), purge_step=start + 1 if start > 0 else None,
                                   flush_secs=flush_secs)
        except OSError as exc:  # (the run folder's disk: metrics.jsonl says the same, and fails the run if it must)
            _say(log, f"TensorBoard files not written: {exc}; training goes on")
            return None
        settings = run_settings(run_json)
        # The hparams summaries go into this same folder (SummaryWriter.add_hparams would
        # make a sub-folder, a second run in TensorBoard's list): the session start with
        # the settings and the metric tags, and its end.
        exp, ssi, sei = hparams(settings, {k: math.nan for k in HPARAM_METRICS})
        fw = writer._get_file_writer()
        for summary in (exp, ssi, sei):
            fw.add_summary(summary)
        return cls(writer, settings)

    def write(self, rec: dict) -> None:
        """One metrics.jsonl record as scalars at its step."""
        step = rec.get("step")
        if type(step) is not int:
            return
        for k, v in record_scalars(rec).items():
            self.writer.add_scalar(k, v, step)

    def close(self) -> None:
        try:
            self.writer.flush()
            self.writer.close()
        except OSError:
            pass  # a full disk: metrics.jsonl and status.json still tell the run
