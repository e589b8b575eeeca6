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


def _check_own_packages() -> None:
    """`engine` and `remote` are Layerflow's top-level packages (the product's layout names
    them). A user's own engine.py or remote.py (a common name in a notebook's folder) comes
    first on sys.path and would be imported in their place, failing deep inside with "'engine'
    is not a package": say in one line which file shadows which, before importing them."""
    import importlib.util
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for name in ("engine", "remote"):
        ours = root / name / "__init__.py"
        mod = sys.modules.get(name)
        if mod is not None:
            origin = getattr(mod, "__file__", None)
        else:
            spec = importlib.util.find_spec(name)
            origin = spec.origin if spec is not None else None
        if origin is not None and Path(origin).resolve() == ours:
            continue
        found = origin if origin not in (None, "namespace") else f"a folder named '{name}' without __init__.py"
        raise ImportError(f"layerflow: {found} shadows Layerflow's own package '{name}' ({ours.parent}); rename "
                          f"your {name} module or folder, or start Python in another folder")


_check_own_packages()

from engine.diff import ProjectDiff  # noqa: E402  (after the check above)
from engine.errors import CheckFailed, LayerflowError  # noqa: E402
from engine.files import ProjectError  # noqa: E402
from engine.diagram.graph import GraphError  # noqa: E402
from engine.errors import InteropError  # noqa: E402
from engine.planning.planner import Plan  # noqa: E402
from engine.runs.build import RunError  # noqa: E402
from engine.runtime.records import RunStatus  # noqa: E402
from engine.runs.sweep import SweepError  # noqa: E402
from layerflow.data import DataError, DataReport, DataUse, Packed, inspect, pack  # noqa: E402
from layerflow.project import Project, Summary, load  # noqa: E402
from layerflow.runs import Job, Run, RunFailed, cluster_jobs  # noqa: E402

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
