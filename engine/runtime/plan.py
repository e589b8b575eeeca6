"""The plan as every rank reads it: typed, versioned, checked when read.

engine/planning/planner.py makes it (Plan.run_plan()); run.json carries it as JSON under
"plan" (RunPlan.to_json); the runtime (distributed/) and the exported script read it
back with RunPlan.from_json, which names the field at fault in run.json. Tensor
layouts are Layout values (DTensor's Shard(d) / Replicate() / Partial(), OneFlow's
split(d) / broadcast / partial_sum), written in JSON by their DTensor names.
Imports only the standard library: it runs on bare GPU nodes.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

PLAN_VERSION = 1  # run.json's plan.version; a newer one is refused with the version it needs
TP_STYLES = ("replicate", "colwise", "rowwise", "sequence")  # engine/diagram/graph.py's node.tp takes these too
SCHEDULES = ("gpipe", "1f1b", "interleaved1f1b", "interleavedzb", "zbv", "dualpipev")
# float8: torchao's float8 training of the Linear layers (GPUs of compute capability 8.9+)
MIXED_PRECISION = ("none", "bf16", "float8")
# several stages per pipeline rank, looped: stage s on rank s % pp
LOOPED = ("interleaved1f1b", "interleavedzb")
# two stages per pipeline rank in a V: rank r runs stages r and 2pp-1-r, so the first and
# the last stage share rank 0 (torch's ScheduleZBVZeroBubble and ScheduleDualPipeV)
V_SHAPED = ("zbv", "dualpipev")
MULTI_STAGE = LOOPED + V_SHAPED  # schedules that run more than one stage per rank
# the weight gradient is split from the input's and fills the bubble
ZERO_BUBBLE = ("interleavedzb", "zbv", "dualpipev")


def stage_rank(schedule: str, pp: int, s: int) -> int:
    """The pipeline rank that runs stage s: looped (s % pp) or, for a V-shaped schedule,
    down the ranks and back up (stage s < pp on rank s, stage s >= pp on rank 2pp-1-s)."""
    if schedule in V_SHAPED and s >= pp:
        return 2 * pp - 1 - s
    return s % pp


def rank_stages(schedule: str, pp: int, n_stages: int, r: int) -> list[int]:
    """The stages pipeline rank r runs, in order: the s with stage_rank(s) == r, found
    without looking at every stage (the planner asks it of each of pp ranks, and a
    placement of 65,536 ranks must be answered, if only with an error)."""
    if schedule in V_SHAPED:
        return sorted(s for s in {r, 2 * pp - 1 - r} if s < n_stages)
    return list(range(r, n_stages, pp))


class PlanError(ValueError):
    """A plan in run.json that the runtime cannot run; the message names the field."""


@dataclass(frozen=True)
class Layout:
    """What each rank's piece of a tensor is on one mesh axis: a shard of dimension
    `dim`, a whole replica, or a partial sum."""
    kind: str  # "shard", "replicate" or "partial"
    dim: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("shard", "replicate", "partial") or (self.kind == "shard") != (self.dim is not None):
            raise PlanError(f"layout {self.kind}({self.dim}) is not Shard(d), Replicate() or Partial()")

    def __str__(self) -> str:
        return {"shard": f"Shard({self.dim})", "replicate": "Replicate()", "partial": "Partial()"}[self.kind]

    @property
    def is_shard(self) -> bool:
        return self.kind == "shard"

    @property
    def oneflow(self) -> str:
        """OneFlow's SBP name: split(d), broadcast, partial_sum."""
        return {"shard": f"split({self.dim})", "replicate": "broadcast", "partial": "partial_sum"}[self.kind]

    @classmethod
    def parse(cls, text: str | None, where: str = "layout") -> Layout:
        """'Shard(-1)', 'Replicate()', 'Partial()' (None: Replicate())."""
        if text is None or text == "Replicate()":
            return REPLICATE
        if text == "Partial()":
            return PARTIAL
        if isinstance(text, str) and text.startswith("Shard(") and text.endswith(")"):
            try:
                return cls("shard", int(text[6:-1]))
            except ValueError:
                pass
        raise PlanError(f"{where}: {text!r} is not a layout (Shard(d), Replicate() or Partial())")


REPLICATE = Layout("replicate")
PARTIAL = Layout("partial")


def shard(dim: int) -> Layout:
    return Layout("shard", dim)


@dataclass(frozen=True)
class TPEntry:
    """One layer under tensor parallelism: its style, and the layouts of its input
    and output on the tp axis (what its neighbours hand it and take from it)."""
    style: str
    type: str | None = None  # the layer type (MultiheadAttention's colwise splits heads)
    input: Layout = REPLICATE
    output: Layout = REPLICATE
    inner: str | None = None  # what a composite layer does inside (shown by the editor)

    def to_json(self) -> dict:
        out = {"style": self.style, "input": str(self.input), "output": str(self.output)}
        if self.type:
            out["type"] = self.type
        if self.inner:
            out["inner"] = self.inner
        return out

    @classmethod
    def from_json(cls, d: dict, where: str = "tp_plan entry") -> TPEntry:
        if not isinstance(d, dict):
            raise PlanError(f"{where}: expected an object with style, input and output, not {d!r}")
        unknown = sorted(set(d) - {"style", "type", "input", "output", "inner"})
        if unknown:
            raise PlanError(f"{where}: unknown field {unknown[0]!r}")
        if d.get("style") not in TP_STYLES:
            raise PlanError(f"{where}.style: {d.get('style')!r} is not one of {', '.join(TP_STYLES)}")
        return cls(d["style"], d.get("type"), Layout.parse(d.get("input"), f"{where}.input"),
                   Layout.parse(d.get("output"), f"{where}.output"), d.get("inner"))


@dataclass
class RunPlan:
    """How a run is laid out over pp x dp x tp processes (ranks pp-major, tp-minor)."""
    pp: int = 1
    dp: int = 1
    tp: int = 1
    data_parallel: str = "ddp"  # or "fsdp" (FSDP2); "none" when dp is 1
    reshard_after_forward: bool = True  # FSDP2: free gathered parameters after forward
    schedule: str = "1f1b"  # pipeline schedule: SCHEDULES; "none" when pp is 1
    microbatches: int = 1
    mixed_precision: str = "none"  # MIXED_PRECISION
    sync_batchnorm: bool = False
    stages: list[list[str]] = field(default_factory=list)  # node ids per pipeline stage
    tp_plan: dict[str, TPEntry] = field(default_factory=dict)  # node id -> its tensor-parallel entry
    checkpoint: list[str] = field(default_factory=list)  # node ids whose activations are recomputed
    cpu_offload: bool = False  # FSDP2: sharded parameters, gradients and optimizer state kept in host memory
    mesh: dict | None = None  # the ranks of each mesh axis, as the planner laid them out (shown, not read)
    version: int = PLAN_VERSION

    @property
    def world(self) -> int:
        return self.pp * self.dp * self.tp

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["tp_plan"] = {n: e.to_json() for n, e in self.tp_plan.items()}
        if self.mesh is None:
            del out["mesh"]
        return out

    @classmethod
    def from_json(cls, d: dict, where: str = "run.json plan") -> RunPlan:
        """Checked field by field; a plan without a version is the first one (older runs)."""
        if not isinstance(d, dict):
            raise PlanError(f"{where}: expected an object, not {type(d).__name__}")
        names = {f.name for f in fields(cls)}
        # the planner's figures kept beside the plan (calibration, the deploy's memory check): not read here
        unknown = sorted(set(d) - names - {"predicted", "predicted_peak_bytes"})
        if unknown:
            raise PlanError(f"{where}: unknown field {unknown[0]!r}")
        version = d.get("version", 1)
        if not isinstance(version, int) or version > PLAN_VERSION:
            raise PlanError(f"{where}.version: {version!r}; this runtime reads plans up to version {PLAN_VERSION}, "
                            f"update Layerflow on this machine")

        def integer(key: str, least: int = 1) -> int:
            v = d.get(key, 1)
            if type(v) is not int or v < least:
                raise PlanError(f"{where}.{key}: {v!r} is not an integer >= {least}")
            return v

        def choice(key: str, options: tuple, default: str) -> str:
            v = d.get(key, default)
            if v not in options:
                raise PlanError(f"{where}.{key}: {v!r} is not one of {', '.join(options)}")
            return v

        def flag(key: str, default: bool) -> bool:
            v = d.get(key, default)
            if not isinstance(v, bool):
                raise PlanError(f"{where}.{key}: {v!r} is not true or false")
            return v

        def ids(value, key: str) -> list[str]:
            if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
                raise PlanError(f"{where}.{key}: expected a list of node ids")
            return list(value)

        stages = d.get("stages") or []
        if not isinstance(stages, list):
            raise PlanError(f"{where}.stages: expected a list of stages (lists of node ids)")
        tp_plan = d.get("tp_plan") or {}
        if not isinstance(tp_plan, dict):
            raise PlanError(f"{where}.tp_plan: expected an object of node id -> entry")
        mesh = d.get("mesh")
        if mesh is not None and not isinstance(mesh, dict):
            raise PlanError(f"{where}.mesh: expected an object")
        plan = cls(pp=integer("pp"), dp=integer("dp"), tp=integer("tp"),
                   data_parallel=choice("data_parallel", ("ddp", "fsdp", "none"), "ddp"),
                   reshard_after_forward=flag("reshard_after_forward", True),
                   schedule=choice("schedule", (*SCHEDULES, "none"), "1f1b"), microbatches=integer("microbatches"),
                   mixed_precision=choice("mixed_precision", MIXED_PRECISION, "none"),
                   sync_batchnorm=flag("sync_batchnorm", False),
                   stages=[ids(s, f"stages[{i}]") for i, s in enumerate(stages)],
                   tp_plan={n: TPEntry.from_json(e, f"{where}.tp_plan.{n}") for n, e in tp_plan.items()},
                   checkpoint=ids(d.get("checkpoint") or [], "checkpoint"),
                   cpu_offload=flag("cpu_offload", False), mesh=mesh, version=version)
        if plan.cpu_offload and plan.data_parallel != "fsdp":
            raise PlanError(f"{where}.cpu_offload: true needs data_parallel fsdp (FSDP2 offloads its shards), "
                            f"not {plan.data_parallel!r}")
        if plan.pp > 1 and len(plan.stages) < plan.pp:
            raise PlanError(f"{where}.stages: {len(plan.stages)} stage(s) for pp={plan.pp}")
        return plan
