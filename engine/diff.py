"""What changed between two projects, by meaning; and the three-way merge of two edits.

`diff_projects(a, b)` matches the nodes of two diagrams (by id first, then by structure:
same type and parameters, or the same wiring, so a renamed or moved node is one node)
and lists what changed: nodes added, removed or renamed, parameters (`fc1.out_features
128 -> 256`), placement fields, rewired inputs, training and placement settings. Then
the consequence: parameters and FLOPs before and after, and which pipeline stage now
holds what.

`merge_projects(base, ours, theirs)` applies both sides' changes to base field by field
(a node's parameters one by one, its inputs port by port, every setting leaf by leaf).
Where both sides changed the same field differently, the merged project takes ours and
records the conflict in its `conflicts` list; the file always loads, `validate` reports
the conflicts and `resolve_conflict` settles one by taking either side. No Qt here.
"""
from __future__ import annotations

import copy
import json
import subprocess
from dataclasses import dataclass, field
from typing import Any

from engine.diagram.graph import Graph, GraphError
from engine.project import Conflict, Project, ProjectError, loads_project

_MISSING = object()  # a key one side does not have
UNSET = {"$unset": True}  # how a conflict record writes "this side has no such key"
_NODE_FIELDS = ("type", "stage", "tp", "checkpoint", "group", "scope")  # params and pos apart
_SETTINGS = ("name", "description", "training", "placement", "cluster", "weights")
_DIAGRAM_SETTINGS = ("direction", "layout")


# ----- matching ---------------------------------------------------------------
def _in_edges(d: dict) -> dict[str, dict[str, tuple[str, str]]]:
    """node -> {input port: (source node, source port)}"""
    out: dict[str, dict[str, tuple[str, str]]] = {}
    for e in d.get("edges", []):
        out.setdefault(e["dst"], {})[e.get("dst_port", "in")] = (e["src"], e.get("src_port", "out"))
    return out


def _out_edges(d: dict) -> dict[str, set[tuple[str, str, str]]]:
    """node -> {(output port, destination node, destination port)}"""
    out: dict[str, set[tuple[str, str, str]]] = {}
    for e in d.get("edges", []):
        out.setdefault(e["src"], set()).add((e.get("src_port", "out"), e["dst"], e.get("dst_port", "in")))
    return out


def _content(n: dict) -> tuple:
    """What a node is, apart from its name and where it is drawn."""
    return (n["type"], json.dumps(n.get("params", {}), sort_keys=True),
            tuple(json.dumps(n.get(f), sort_keys=True) for f in _NODE_FIELDS[1:]))


def match_nodes(a: dict, b: dict) -> dict[str, str]:
    """Node ids of diagram `a` -> the same node's id in `b`.

    By id first. The rest by structure, in rounds: a pair of the same type is taken when
    each is the other's single best candidate, scored by the wiring they share with nodes
    already matched (at least one input or output), then by equal parameters and by
    position; so renames inside a chain resolve from its matched ends inward. A node
    whose type changed, or that shares no wiring, is matched only by its id."""
    an = {n["id"]: n for n in a.get("nodes", [])}
    bn = {n["id"]: n for n in b.get("nodes", [])}
    m = {i: i for i in an if i in bn}
    rest_a = [i for i in an if i not in m]
    rest_b = {i for i in bn if i not in m.values()}
    if not rest_a or not rest_b:
        return m
    a_in, b_in = _in_edges(a), _in_edges(b)
    a_out, b_out = _out_edges(a), _out_edges(b)
    by_type: dict[str, list[str]] = {}
    for i in rest_b:
        by_type.setdefault(bn[i]["type"], []).append(i)
    if sum(len(by_type.get(an[i]["type"], [])) for i in rest_a) > 4_000_000:
        return m  # two unrelated diagrams of thousands of nodes: not worth pairing by structure

    def score(x: str, y: str) -> float:
        wiring = 0
        for port, (src, sport) in a_in.get(x, {}).items():
            if b_in.get(y, {}).get(port) == (m.get(src), sport):
                wiring += 1
        targets = {(p, m.get(d), dp) for p, d, dp in a_out.get(x, ())}
        wiring += len(targets & b_out.get(y, set()))
        if not wiring:  # same type and parameters alone is a removed node and an added one
            return 0.0
        same = _content(an[x]) == _content(bn[y])
        (x0, y0), (x1, y1) = an[x].get("pos", (0, 0)), bn[y].get("pos", (0, 0))
        near = 1.0 / (1.0 + (abs(x0 - x1) + abs(y0 - y1)) / 100.0)
        return 2.0 * wiring + (3.0 if same else 0.0) + near

    while rest_a and rest_b:
        best_a: dict[str, tuple[float, str | None]] = {}
        best_b: dict[str, tuple[float, str | None]] = {}
        for x in rest_a:
            for y in by_type.get(an[x]["type"], []):
                if y not in rest_b:
                    continue
                s = score(x, y)
                if s <= 0:
                    continue
                for best, key, other in ((best_a, x, y), (best_b, y, x)):
                    old = best.get(key)
                    if old is None or s > old[0]:
                        best[key] = (s, other)
                    elif s == old[0]:
                        best[key] = (s, None)  # a tie: not this round
        pairs = [(x, y) for x, (s, y) in best_a.items() if y is not None and best_b.get(y, (0, None))[1] == x]
        if not pairs:
            break
        for x, y in pairs:
            m[x] = y
            rest_b.discard(y)
        rest_a = [x for x in rest_a if x not in m]
    return m


# ----- diff -------------------------------------------------------------------
@dataclass(frozen=True)
class Change:
    """One change. kind: added, removed, renamed, type, param, placement, group, moved,
    input (an input port rewired), setting. `where` names the node (its id in B, in A for
    removed ones) or the setting's path."""

    kind: str
    where: str
    old: Any = None
    new: Any = None

    def text(self) -> str:
        k, w = self.kind, self.where
        if k == "added":
            return f"+ {w} ({self.new})"
        if k == "removed":
            return f"- {w} ({self.old})"
        if k == "renamed":
            return f"~ {self.old} renamed to {self.new}"
        if k == "moved":
            return f"  {w} moved on the canvas"
        if k == "input":
            return f"~ {w}: input from {self.old or 'nothing'} -> {self.new or 'nothing'}"
        return f"~ {w} {_show(self.old)} -> {_show(self.new)}"


def _show(v: Any) -> str:
    if v is _MISSING or v == UNSET:
        return "(unset)"
    if v is None:
        return "(none)"
    if isinstance(v, str):
        return v if v and " " not in v else repr(v)
    return json.dumps(v, sort_keys=True) if isinstance(v, (dict, list, tuple)) else str(v)


@dataclass
class ProjectDiff:
    changes: list[Change] = field(default_factory=list)
    renames: dict[str, str] = field(default_factory=dict)  # id in A -> id in B
    consequences: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.changes

    def node_status(self) -> dict[str, tuple[str, str]]:
        """Node id in B -> (added | changed, what changed), for the editor's colours;
        removed nodes are under their id in A with 'removed'."""
        out: dict[str, tuple[str, list[str]]] = {}
        for c in self.changes:
            if c.kind in ("setting",):
                continue
            node = c.where.split(".", 1)[0].split(":", 1)[0]
            if c.kind == "added":
                out[node] = ("added", [c.text()])
            elif c.kind == "removed":
                out[node] = ("removed", [c.text()])
            elif c.kind != "moved":
                _status, lines = out.setdefault(node, ("changed", []))
                lines.append(c.text())
        return {k: (s, "\n".join(lines)) for k, (s, lines) in out.items()}

    def text(self) -> str:
        if self.empty:
            return "no changes"
        moved = [c for c in self.changes if c.kind == "moved"]
        lines = [c.text() for c in self.changes if c.kind != "moved"]
        if moved:
            lines.append(f"  {len(moved)} node(s) moved on the canvas: " + ", ".join(c.where for c in moved[:8])
                         + (" ..." if len(moved) > 8 else ""))
        return "\n".join(lines + [""] + self.consequences if self.consequences else lines)

    def to_json(self) -> dict:
        def plain(v):
            return None if v is _MISSING else v

        return {"changes": [{"kind": c.kind, "where": c.where, "old": plain(c.old), "new": plain(c.new)}
                            for c in self.changes],
                "renames": self.renames, "consequences": self.consequences}


def _flatten(d: Any, prefix: str, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(d, dict) and d:
        for k, v in d.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    else:
        out[prefix] = d
    return out


def _settings(p: dict) -> dict[str, Any]:
    """Every setting of a project as path -> value (a data set whose kind differs is one value)."""
    out: dict[str, Any] = {}
    for key in _SETTINGS:
        _flatten(p.get(key), key, out)
    dia = p.get("diagram", {})
    for key in _DIAGRAM_SETTINGS:
        out[f"diagram.{key}"] = dia.get(key, "LR" if key == "direction" else None)
    return out


def _normal(p: Project | dict) -> dict:
    if isinstance(p, Project):
        return p.to_dict()
    return Project.from_dict(p).to_dict()


def diff_projects(a: Project | dict, b: Project | dict, *, consequences: bool = True) -> ProjectDiff:
    """What changed from `a` to `b` (Projects or project dicts)."""
    pa, pb = _normal(a), _normal(b)
    da, db = pa["diagram"], pb["diagram"]
    an = {n["id"]: n for n in da["nodes"]}
    bn = {n["id"]: n for n in db["nodes"]}
    m = match_nodes(da, db)
    out = ProjectDiff(renames={x: y for x, y in m.items() if x != y})
    ch = out.changes
    back = {y: x for x, y in m.items()}
    for x, y in m.items():
        if x != y:
            ch.append(Change("renamed", y, x, y))
    for y, n in bn.items():
        if y not in back:
            ch.append(Change("added", y, None, n["type"]))
    for x, n in an.items():
        if x not in m:
            ch.append(Change("removed", x, n["type"], None))
    for x, y in m.items():
        na, nb = an[x], bn[y]
        if na["type"] != nb["type"]:
            ch.append(Change("type", f"{y}.type", na["type"], nb["type"]))
        pa_, pb_ = na.get("params", {}), nb.get("params", {})
        for k in sorted(set(pa_) | set(pb_)):
            va, vb = pa_.get(k, _MISSING), pb_.get(k, _MISSING)
            if va != vb:
                ch.append(Change("param", f"{y}.{k}", va, vb))
        for f in ("stage", "tp", "checkpoint"):
            if na.get(f) != nb.get(f):
                ch.append(Change("placement", f"{y}.{f}", na.get(f), nb.get(f)))
        if na.get("group") != nb.get("group"):
            ch.append(Change("group", f"{y}.block", na.get("group"), nb.get("group")))
        if list(na.get("pos", ())) != list(nb.get("pos", ())):
            ch.append(Change("moved", y, na.get("pos"), nb.get("pos")))
    # inputs, port by port, in B's names (A's sources renamed)
    a_in, b_in = _in_edges(da), _in_edges(db)
    for y in bn:
        if y not in back:
            continue  # an added node's inputs come with it
        x = back[y]
        ia = {port: (m.get(s, s + " (removed)"), sp) for port, (s, sp) in a_in.get(x, {}).items()}
        ib = b_in.get(y, {})
        for port in sorted(set(ia) | set(ib)):
            if ia.get(port) != ib.get(port):
                ch.append(Change("input", f"{y}.{port}", _end(ia.get(port)), _end(ib.get(port))))
    sa, sb = _settings(pa), _settings(pb)
    for k in sorted(set(sa) | set(sb), key=lambda k: list(sa).index(k) if k in sa else len(sa)):
        va, vb = sa.get(k, _MISSING), sb.get(k, _MISSING)
        if va != vb:
            ch.append(Change("setting", k, va, vb))
    for key in ("collapsed", "unfolded"):
        ga, gb = set(da.get(key, [])), set(db.get(key, []))
        if ga != gb:
            ch.append(Change("setting", f"diagram.{key}", sorted(ga), sorted(gb)))
    def renamed(end: str) -> str:  # "node.param" in B's names
        node, _, param = end.partition(".")
        return f"{m.get(node, node)}.{param}"

    ta, tb = da.get("ties", {}), db.get("ties", {})
    if {renamed(k): renamed(v) for k, v in ta.items()} != tb:  # a renamed node's ties are not a change
        ch.append(Change("setting", "diagram.ties", ta, tb))
    if consequences and ch:
        out.consequences = _consequences(pa, pb, m)
    return out


def _end(e: tuple[str, str] | None) -> str | None:
    if e is None:
        return None
    return e[0] if e[1] == "out" else f"{e[0]}.{e[1]}"


def _consequences(pa: dict, pb: dict, m: dict[str, str]) -> list[str]:
    """Parameters, FLOPs and pipeline stages before and after."""
    from engine.diagram.compile import compile_graph
    from engine.units import human

    lines: list[str] = []
    projects, results = [], []
    for p in (pa, pb):
        proj = Project.from_dict(p)
        projects.append(proj)
        results.append(compile_graph(proj.graph))
    ra, rb = results
    if ra.ok and rb.ok:
        dp, df = rb.total_params - ra.total_params, rb.total_flops - ra.total_flops
        lines.append(f"parameters {ra.total_params:,} -> {rb.total_params:,} ({dp:+,})")
        lines.append(f"FLOPs/sample {human(ra.total_flops)} -> {human(rb.total_flops)} "
                     f"({'+' if df >= 0 else '-'}{human(abs(df))})")
    else:
        for name, r in (("before", ra), ("after", rb)):
            if not r.ok:
                lines.append(f"{name}: the diagram does not compile ({len(r.errors)} error(s): {r.errors[0]})")
        return lines
    from engine.planning.planner import make_plan

    plans = []
    for proj, r in zip(projects, results):
        pl = proj.placement
        world = pl.pp * pl.dp * pl.tp
        try:
            plans.append(make_plan(proj, world, compiled=r))
        except Exception as exc:  # noqa: BLE001  a plan that cannot be made is a consequence too, not a crash of diff
            plans.append(None)
            lines.append(f"plan: cannot be made ({type(exc).__name__}: {exc})")
    if None in plans:
        return lines
    qa, qb = plans
    if qa.errors != qb.errors and qb.errors:
        lines.append(f"plan: now refused: {qb.errors[0]}")
    sa = [[m.get(n, n) for n in s] for s in (qa.run.stages if qa.run else [])]
    sb = [list(s) for s in (qb.run.stages if qb.run else [])]
    if sa != sb and max(len(sa), len(sb)) > 1:  # one stage holds everything: nothing to say
        if len(sa) != len(sb):
            lines.append(f"plan changed: {len(sa)} pipeline stage(s) -> {len(sb)}")
        for i in range(max(len(sa), len(sb))):
            old = sa[i] if i < len(sa) else []
            new = sb[i] if i < len(sb) else []
            if old != new:
                gained = [n for n in new if n not in old]
                lost = [n for n in old if n not in new]
                bits = []
                if gained:
                    bits.append("now holds " + _few(gained))
                if lost:
                    bits.append("no longer holds " + _few(lost))
                lines.append(f"plan changed: stage {i} " + ("; ".join(bits) if bits else "holds the same nodes in "
                                                                                          "another order"))
    return lines


def _few(ids: list[str], n: int = 6) -> str:
    return ", ".join(ids[:n]) + (f" and {len(ids) - n} more" if len(ids) > n else "")


# ----- merge ------------------------------------------------------------------
@dataclass
class MergeResult:
    project: dict
    conflicts: list[Conflict]

    @property
    def clean(self) -> bool:
        return not self.conflicts


def _recorded(v: Any) -> Any:
    """A side's value as a conflict record holds it (UNSET: that side has no such key)."""
    return UNSET if v is _MISSING else v


def _pick(b: Any, o: Any, t: Any) -> tuple[Any, bool]:
    """Three-way value: (merged, conflicted?)."""
    if o == t:
        return o, False
    if o == b:
        return t, False
    if t == b:
        return o, False
    return o, True


def _unique(base: str, taken: set[str]) -> str:
    i = 2
    while f"{base}_{i}" in taken:
        i += 1
    return f"{base}_{i}"


def merge_projects(base: Project | dict | None, ours: Project | dict, theirs: Project | dict) -> MergeResult:
    """Three-way merge; `base` None: both sides added the file (an empty common ancestor).
    Raises ProjectError if ours or theirs does not load; the result always loads."""
    po, pt = _normal(ours), _normal(theirs)
    pb = _normal(base) if base is not None else {"diagram": {"nodes": [], "edges": []}}
    conflicts: list[Conflict] = []
    db, do, dt = pb["diagram"], po["diagram"], pt["diagram"]
    bn = {n["id"]: n for n in db["nodes"]}
    on = {n["id"]: n for n in do["nodes"]}
    tn = {n["id"]: n for n in dt["nodes"]}
    mo, mt = match_nodes(db, do), match_nodes(db, dt)
    # identities: base ids for nodes base has; ("o", id) / ("t", id) for added ones
    ident_o = {y: x for x, y in mo.items()}
    ident_t = {y: x for x, y in mt.items()}
    result: dict[Any, dict] = {}  # identity -> merged node
    order: list[Any] = []

    for x, nb in bn.items():
        o = on.get(mo[x]) if x in mo else None
        t = tn.get(mt[x]) if x in mt else None
        if o is None and t is None:
            continue
        if o is None or t is None:
            kept, side = (t, "theirs") if o is None else (o, "ours")
            if _content(kept) == _content(nb):
                continue  # removed on one side, untouched on the other
            # removed on one side, changed on the other: keep it (nothing is lost) and record it
            node = copy.deepcopy(kept)
            result[x] = node
            order.append(x)
            gone = "ours" if o is None else "theirs"
            conflicts.append(Conflict(f"node:{node['id']}", f"{gone} removed node '{x}', {side} changed it",
                                      nb, None if o is None else _with_edges(o, do), None if t is None else
                                      _with_edges(t, dt)))
            continue
        node: dict = {}
        nid, clash = _pick(x, o["id"], t["id"])
        node["id"] = nid
        if clash:
            conflicts.append(Conflict(f"node:{nid}:id", f"node '{x}' renamed to '{o['id']}' by ours and to "
                                                        f"'{t['id']}' by theirs", x, o["id"], t["id"]))
        node.update(_merge_keys(*({f: n[f] for f in _NODE_FIELDS if f in n} for n in (nb, o, t)),
                                f"node:{nid}:{{}}", f"{nid}.{{}} changed on both sides", conflicts))
        node["params"] = _merge_keys(nb.get("params", {}), o.get("params", {}), t.get("params", {}),
                                     f"node:{nid}:params.{{}}", f"{nid}.{{}} changed on both sides", conflicts)
        node["pos"], _ = _pick(nb.get("pos"), o.get("pos"), t.get("pos"))  # a position is never a conflict
        result[x] = node
        order.append(x)
    # added nodes
    taken = {n["id"] for n in result.values()}
    for side, nodes, ident in (("o", on, ident_o), ("t", tn, ident_t)):
        for y, n in nodes.items():
            if y in ident:
                continue
            key = (side, y)
            if side == "t" and ("o", y) in result:
                if _content(result["o", y]) == _content(n):
                    ident_t[y] = ("o", y)  # both added the same node
                    continue
                conflicts.append(Conflict(f"node:{y}", f"both sides added a node named '{y}', differently", None,
                                          _with_edges(on[y], do), _with_edges(n, dt)))
                ident_t[y] = ("o", y)  # their edges go to our node of that name
                continue
            node = copy.deepcopy(n)
            if node["id"] in taken:  # e.g. theirs added fc3 while ours renamed fc2 to fc3
                node["id"] = _unique(node["id"], taken)
            taken.add(node["id"])
            result[key] = node
            order.append(key)
            ident[y] = key
    # edges: each side's, in identities, merged as sets; then one edge per input
    def edge_set(d: dict, ident: dict) -> dict[tuple, tuple]:
        out = {}
        for e in d["edges"]:
            s, t_ = ident.get(e["src"], ("?", e["src"])), ident.get(e["dst"], ("?", e["dst"]))
            out[(s, e.get("src_port", "out"), t_, e.get("dst_port", "in"))] = (t_, e.get("dst_port", "in"))
        return out

    eb = edge_set(db, {x: x for x in bn})
    eo, et = edge_set(do, ident_o), edge_set(dt, ident_t)
    merged = [e for e in eb if e in eo and e in et] + [e for e in eo if e not in eb] + \
             [e for e in et if e not in eb and e not in eo]
    fed: dict[tuple, tuple] = {}
    for e in merged:
        if e[0] not in result or e[2] not in result:
            continue
        port = (e[2], e[3])
        if port in fed:
            old = fed[port]
            conflicts.append(Conflict(f"input:{result[e[2]]['id']}.{e[3]}",
                                      f"input {result[e[2]]['id']}.{e[3]} wired differently on both sides", None,
                                      _edge_dict(old, result), _edge_dict(e, result)))
            continue
        fed[port] = e
    edges = list(fed.values())
    # settings, leaf by leaf
    merged_p: dict = {"format_version": po["format_version"]}
    # no common ancestor: every setting the two sides differ on is a conflict
    sb, so, st = (_settings(pb) if base is not None else {}), _settings(po), _settings(pt)
    for whole in ("training.dataset",):  # a data set whose kind changed is one value
        kinds = {d.get(f"{whole}.kind") for d in (sb, so, st) if d}
        if len(kinds) > 1:
            for d, p in ((sb, pb), (so, po), (st, pt)):
                if not d:
                    continue
                for k in [k for k in d if k.startswith(whole + ".")]:
                    del d[k]
                d[whole] = p["training"]["dataset"]
    flat = _merge_keys(sb, so, st, "setting:{}", "{} changed on both sides", conflicts)
    for k, v in flat.items():
        _set_path(merged_p, k, v)
    diagram = {"nodes": [result[k] for k in order], "edges": [_edge_dict(e, result) for e in edges]}
    for key in ("direction", "layout"):
        v = flat.get(f"diagram.{key}")
        if v is not None:
            diagram[key] = v
    merged_p.pop("diagram", None)
    for key in ("collapsed", "unfolded"):  # editor state: sets, no conflicts
        b_, o_, t_ = set(db.get(key, [])), set(do.get(key, [])), set(dt.get(key, []))
        v = sorted((b_ & o_ & t_) | (o_ - b_) | (t_ - b_))
        if v:
            diagram[key] = v
    ties = _merge_keys(db.get("ties", {}), do.get("ties", {}), dt.get("ties", {}), "setting:diagram.ties.{}",
                       "tie {} changed on both sides", conflicts)
    if ties:
        diagram["ties"] = ties
    merged_p["diagram"] = diagram
    merged_p["conflicts"] = po.get("conflicts", []) + [c.to_dict() for c in conflicts]
    return MergeResult(_loadable(merged_p, po, pt, conflicts), conflicts)


def _merge_keys(b: dict, o: dict, t: dict, where: str, what: str, conflicts: list[Conflict]) -> dict:
    """Three-way merge of flat dicts key by key; a key both sides changed differently
    takes ours and adds a Conflict (`where`/`what` are formats of the key)."""
    out = {}
    for k in list(dict.fromkeys([*b, *o, *t])):
        v, clash = _pick(b.get(k, _MISSING), o.get(k, _MISSING), t.get(k, _MISSING))
        if v is not _MISSING:
            out[k] = v
        if clash:
            conflicts.append(Conflict(where.format(k), what.format(k), *(_recorded(s.get(k, _MISSING)) for s in (b, o, t))))
    return out


def show_value(v: Any, limit: int = 60) -> str:
    """A value of a conflict record, short: (unset), node NAME (TYPE), JSON."""
    if v is _MISSING or v == UNSET:
        return "(unset)"
    if isinstance(v, dict) and "node" in v:
        return f"node {v['node']['id']} ({v['node']['type']})"
    if v is None:
        return "(none)"
    s = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
    return s if len(s) <= limit else s[:limit - 3] + "..."


def _edge_dict(e: tuple, result: dict) -> dict:
    return {"src": result[e[0]]["id"], "src_port": e[1], "dst": result[e[2]]["id"], "dst_port": e[3]}


def _with_edges(node: dict, d: dict) -> dict:
    """A node with the edges that touch it, as one side of a whole-node conflict."""
    return {"node": copy.deepcopy(node),
            "edges": [e for e in d["edges"] if node["id"] in (e["src"], e["dst"])]}


def _set_path(d: dict, path: str, v: Any) -> None:
    keys = path.split(".")
    for k in keys[:-1]:
        d = d.setdefault(k, {})
    d[keys[-1]] = copy.deepcopy(v)


def _loadable(merged: dict, ours: dict, theirs: dict, conflicts: list[Conflict]) -> dict:
    """The merged project if it loads and its edges make no cycle; else ours with the
    reason as a conflict, so the file written always opens."""
    try:
        p = Project.from_dict(merged, "merged project")
        cycle = p.graph.find_cycle()
        if cycle:
            raise ProjectError("the merged edges make a cycle: " + " -> ".join(cycle))
        return p.to_dict()
    except (ProjectError, GraphError) as exc:
        fallback = copy.deepcopy(ours)
        conflicts.append(Conflict("project", f"the two sides do not combine into one valid project ({exc}); "
                                             "this is ours, theirs is recorded whole", None, None,
                                  {k: v for k, v in theirs.items() if k != "conflicts"}))
        fallback["conflicts"] = [c.to_dict() for c in conflicts]
        return Project.from_dict(fallback, "merged project").to_dict()


# ----- resolving --------------------------------------------------------------
def conflict_lines(project: Project) -> list[str]:
    """The project's merge conflicts left, numbered from 1 as `layerflow resolve` takes them."""
    return [f"{i}. {c.what} ({c.where}): ours {show_value(c.ours)}, theirs {show_value(c.theirs)}"
            for i, c in enumerate(project.conflicts, 1)]


def resolve_conflict(project: Project, index: int, side: str) -> None:
    """Settle conflict `index` of `project` (in place) by taking `side`'s value ('ours' or
    'theirs'). Raises ProjectError if the result would not be a valid project, leaving the
    project as it was."""
    if side not in ("ours", "theirs"):
        raise ProjectError(f"side must be ours or theirs, not {side!r}")
    if not 0 <= index < len(project.conflicts):
        raise ProjectError(f"conflict {index + 1} does not exist: the project has {len(project.conflicts)}")
    c = project.conflicts[index]
    d = project.to_dict()
    d["conflicts"] = [x for i, x in enumerate(d["conflicts"]) if i != index]
    _apply(d, c.where, getattr(c, side))
    new = Project.from_dict(d, f"resolving {c.where}")
    cycle = new.graph.find_cycle()
    if cycle:
        raise ProjectError(f"taking {side} for {c.where} makes a cycle: " + " -> ".join(cycle))
    project.graph.load_dict(new.graph.to_dict())
    for attr in ("name", "description", "training", "placement", "cluster", "weights", "conflicts", "left_out"):
        setattr(project, attr, getattr(new, attr))


def _apply(d: dict, where: str, value: Any) -> None:
    nodes = d["diagram"]["nodes"]
    edges = d["diagram"]["edges"]
    kind, _, rest = where.partition(":")
    if kind == "setting":
        keys = rest.split(".")
        if keys[0] == "diagram":
            target = d["diagram"]
            keys = keys[1:]
        else:
            target = d
        for k in keys[:-1]:
            target = target.setdefault(k, {})
        if value == UNSET:
            target.pop(keys[-1], None)
        else:
            target[keys[-1]] = copy.deepcopy(value)
    elif kind == "node" and ":" in rest:
        nid, _, f = rest.partition(":")
        node = next(n for n in nodes if n["id"] == nid)
        if f == "id":
            g = Graph.from_dict(d["diagram"])
            g.rename_node(nid, value)
            d["diagram"] = g.to_dict()
        elif f.startswith("params."):
            k = f.split(".", 1)[1]
            if value == UNSET:
                node["params"].pop(k, None)
            else:
                node["params"][k] = copy.deepcopy(value)
        elif value == UNSET or value is None:
            node.pop(f, None)
        else:
            node[f] = copy.deepcopy(value)
    elif kind == "node":
        nid = rest
        d["diagram"]["nodes"] = [n for n in nodes if n["id"] != nid]
        d["diagram"]["edges"] = [e for e in edges if nid not in (e["src"], e["dst"])]
        if value:  # the chosen side keeps the node: put it back with its edges that still fit
            d["diagram"]["nodes"].append(copy.deepcopy(value["node"]))
            ids = {n["id"] for n in d["diagram"]["nodes"]}
            fed = {(e["dst"], e["dst_port"]) for e in d["diagram"]["edges"]}
            for e in value["edges"]:
                if e["src"] in ids and e["dst"] in ids and (e["dst"], e["dst_port"]) not in fed:
                    d["diagram"]["edges"].append(copy.deepcopy(e))
                    fed.add((e["dst"], e["dst_port"]))
    elif kind == "input":
        dst, _, port = rest.rpartition(".")
        d["diagram"]["edges"] = [e for e in edges if (e["dst"], e["dst_port"]) != (dst, port)]
        if value:
            d["diagram"]["edges"].append(copy.deepcopy(value))
    elif kind == "project":
        if value is None:  # ours: the project as it is
            return
        keep = d.get("conflicts", [])
        d.clear()
        d.update(copy.deepcopy(value))
        d["conflicts"] = keep
    else:
        raise ProjectError(f"conflict at {where!r}: not a place Layerflow knows how to resolve")


# ----- git --------------------------------------------------------------------
def git(args: list[str], cwd) -> str:
    """git's output; ProjectError with git's own message when it fails or is missing."""
    try:
        r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=60)
    except FileNotFoundError:
        raise ProjectError("git is not installed (apt-get install git)") from None
    if r.returncode:
        raise ProjectError(f"git {' '.join(args)}: {r.stderr.strip() or 'failed'}")
    return r.stdout


def at_revision(path, rev: str = "HEAD") -> Project:
    """The project file `path` as git holds it at revision `rev`."""
    from pathlib import Path

    path = Path(path)
    folder = path.resolve().parent
    git(["rev-parse", "--git-dir"], folder)
    rel = git(["rev-parse", "--show-prefix"], folder).strip() + path.name
    r = subprocess.run(["git", "show", f"{rev}:{rel}"], cwd=folder, capture_output=True, check=False, timeout=60)
    if r.returncode:
        raise ProjectError(f"git has no {rel} at {rev}: {r.stderr.decode(errors='replace').strip()}")
    return loads_project(r.stdout, f"{rel}@{rev}")
