"""Layerflow as a Python library: the same core the command line and the editor use.

    import layerflow as lf

    p = lf.Project.new("mlp", dataset={"kind": "digits"}, steps=60)
    x = p.add("Input", shape=[64])
    h = p.add("ReLU", p.add("Linear", x, out_features=128))
    p.add("Output", p.add("Linear", h, out_features=10), loss="cross_entropy")
    print(p.summary())                      # shapes, parameters, FLOPs per node
    print(p.place(dp=2))                    # the plan: what each device holds, what moves
    run = p.train()                         # two processes (torchrun) on this machine
    for rec in run.metrics(follow=True):    # each record as it is written
        print(rec["step"], rec.get("loss"))

`Project.load(path)`, `.from_module(model, input_shape=...)` and `.from_onnx(path)` open
existing models; `.validate()`, `.autoplace(devices=N)`, `.deploy(cluster)` (a `Job` with
`status()`, `metrics(follow=True)`, `cancel()`, `fetch()`), `.export_onnx()`,
`.export_script()`, `.save()`, `.diff(other)` and `.sweep(sweep)` (a queue of runs over a
grid or a random sample of settings; returns the runs-table rows) do what the commands of
the same names do.
Every error is a `LayerflowError` whose message names the node, field or host at fault.

Data sets read in place (folders of images, token files, Parquet, arrays, tar shards):

    report = lf.inspect("photos/", image_size=64)   # samples, shapes, classes, samples/s
    print(report); report.save_previews("previews/")  # the text `layerflow data inspect` prints
    lf.pack(["corpus.txt"], "tokens/")               # text -> train.bin, val.bin (also images
                                                     # -> tar shards, .npz/.csv -> .npy)
    used = p.use_data("tokens/", fit=True)           # training.dataset; the Input follows the data
    print(used.mismatches)                           # e.g. a classifier's outputs vs the classes

A data set that cannot be read raises `lf.DataError`, naming the file and sample or row.
"""
from __future__ import annotations

from engine.diff import ProjectDiff
from engine.errors import CheckFailed, LayerflowError
from engine.files import ProjectError
from engine.diagram.graph import GraphError
from engine.interop.common import InteropError
from engine.planning.planner import Plan
from engine.runs.build import RunError
from engine.runtime.records import RunStatus
from engine.runs.sweep import SweepError
from layerflow.data import DataError, DataReport, DataUse, Packed, inspect, pack
from layerflow.project import Project, Summary, load
from layerflow.runs import Job, Run, RunFailed, cluster_jobs

Status = RunStatus  # what `Run.status()` and `Job.status()` return: .state, .step, .total_steps, .error, .done, .ok

__all__ = [
           "CheckFailed",
           "DataError",
           "DataReport",
           "DataUse",
           "GraphError",
           "InteropError",
           "Job",
           "LayerflowError",
           "Packed",
           "Plan",
           "Project",
           "ProjectDiff",
           "ProjectError",
           "Run",
           "RunError",
           "RunFailed",
           "RunStatus",
           "Status",
           "Summary",
           "SweepError",
           "cluster_jobs",
           "inspect",
           "load",
           "pack",
]
