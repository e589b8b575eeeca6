"""Nested blocks from an imported model's module tree, laid out as units."""
from __future__ import annotations

import pytest

from engine.diagram.graph import Graph, block_name, block_path, block_type
from engine.interop.module.importer import from_module
from engine.diagram.layout import card_of, repeated_runs, view_layout
from engine.project import load_project, save_project

from real_models import GPT, ResNet50


@pytest.fixture(scope="module")
def resnet50():
    return from_module(ResNet50(), [[3, 32, 32]], name="resnet50")


def visible_units(g: Graph) -> dict[str, list[str]]:
    """What the editor shows: each node, or the outermost collapsed block holding it."""
    runs = repeated_runs(g)
    out: dict[str, list[str]] = {}
    for nid in g.nodes:
        out.setdefault(card_of(g, nid, runs) or nid, []).append(nid)
    return out


def test_resnet50_opens_as_a_stem_four_stages_and_a_head(resnet50):
    g = resnet50.project.graph
    assert len(g.nodes) == 177
    units = visible_units(g)
    assert [u for u in units if u not in g.nodes] == ["layer1", "layer2", "layer3", "layer4"]
    assert [u for u in units if u in g.nodes] == ["x", "conv1", "bn1", "relu", "maxpool", "avgpool", "flatten",
                                                  "fc", "output"]
    assert sorted(b for b in g.blocks() if b.startswith("layer3/") and b.count("/") == 1) == \
        [f"layer3/layer3.{i}" for i in range(6)]
    assert block_type(g, "layer3/layer3.0") == "Bottleneck" and block_type(g, "layer3") == "Sequential"
    assert block_path(g.nodes["layer3_0_conv2"].group) == ["layer3", "layer3/layer3.0"]
    assert g.nodes["layer3_0_downsample_0"].group == "layer3/layer3.0/layer3.0.downsample"
    assert block_name("layer3/layer3.0") == "layer3.0"
    assert g.collapsed == g.blocks() and g.layout == "hierarchy"


def _overlaps(g: Graph) -> list:
    from engine.diagram.layout import CARD_EXTRA, NODE_W, _card_height, _height

    boxes = []
    for u, members in visible_units(g).items():
        x, y = g.nodes[members[0]].pos
        h = _height(g, u) if u in g.nodes else _card_height(g, set(members))
        boxes.append((u, x, y, x + NODE_W, y + h))
        assert CARD_EXTRA > 0
    return [(a[0], b[0]) for i, a in enumerate(boxes) for b in boxes[i + 1:]
            if a[1] < b[3] and b[1] < a[3] and a[2] < b[4] and b[2] < a[4]]


def test_each_view_is_laid_out_with_blocks_as_units(resnet50):
    g = resnet50.project.graph.copy()
    assert _overlaps(g) == []
    for b in ("layer3", "layer3/layer3.0", "layer3/layer3.0/layer3.0.downsample"):
        g.collapsed.discard(b)  # expand a stage, then one of its blocks, then the block inside
        for nid, p in view_layout(g).items():
            g.nodes[nid].pos = p
        assert _overlaps(g) == [], b
        # an expanded block's frame (the box around what it shows) holds nothing from outside it
        units = visible_units(g)
        members = set(g.block_members(b))
        inside = [m[0] for u, m in units.items() if m[0] in members]
        xs, ys = [g.nodes[n].pos[0] for n in inside], [g.nodes[n].pos[1] for n in inside]
        for u, m in units.items():
            if m[0] not in members:
                x, y = g.nodes[m[0]].pos
                assert not (min(xs) <= x <= max(xs) and min(ys) <= y <= max(ys)), (b, u)


def test_blocks_and_their_state_are_saved_and_loaded(resnet50, tmp_path):
    p = resnet50.project.copy()
    p.graph.collapsed.discard("layer2")
    save_project(p, tmp_path / "r.lflow")
    again = load_project(tmp_path / "r.lflow").graph
    assert again.collapsed == p.graph.collapsed and again.layout == "hierarchy"
    assert {n: x.group for n, x in again.nodes.items()} == {n: x.group for n, x in p.graph.nodes.items()}


def test_a_gpt_opens_as_embeddings_its_blocks_and_a_head():
    """nanoGPT loops over transformer.h (a ModuleList that is never called itself): each
    Block is a top-level block holding its attention and MLP; the three identical Blocks
    show as one card (a folded run) until unfolded."""
    g = from_module(GPT(n_layer=3), [[16]], ["int64"]).project.graph
    units = visible_units(g)
    assert list(units) == ["idx", "transformer_wte", "add", "transformer.h.0", "transformer_ln_f", "lm_head", "output"]
    assert repeated_runs(g)["transformer.h.1"] == [f"transformer.h.{i}" for i in range(3)]
    assert len(units["transformer.h.0"]) == 3 * len(g.block_members("transformer.h.0"))
    g.unfolded.add("transformer.h.0")
    assert list(visible_units(g))[3:6] == ["transformer.h.0", "transformer.h.1", "transformer.h.2"]
    for nid, p in view_layout(g).items():
        g.nodes[nid].pos = p
    assert _overlaps(g) == []
    assert "unfolded" in g.to_dict() and Graph.from_dict(g.to_dict()).unfolded == {"transformer.h.0"}
    assert {block_type(g, f"transformer.h.{i}") for i in range(3)} == {"Block"}
    assert sorted(b for b in g.blocks() if b.startswith("transformer.h.1/")) == \
        ["transformer.h.1/transformer.h.1.attn", "transformer.h.1/transformer.h.1.mlp"]
    assert block_type(g, "transformer.h.1/transformer.h.1.attn") == "CausalSelfAttention"


def test_warnings_that_repeat_over_many_nodes_are_one_message(resnet50, tmp_path, capsys):
    """`plan` with dp=4 on ResNet-50: one BatchNorm warning naming how many nodes and the
    fix, not 53 lines; the nodes are listed (the first ones in the text, all in the group)."""
    from app.cli import main
    from engine.planning.planner import grouped, make_plan

    p = resnet50.project.copy()
    p.placement = p.placement.derive(dp=4)
    plan = make_plan(p, 4)
    bn = [w for w in plan.warnings if "BatchNorm2d" in w]
    assert len(bn) == 53
    groups = grouped(plan.warnings)
    text, nodes = next(g for g in groups if "BatchNorm2d" in g[0])
    assert text.startswith("53 BatchNorm2d nodes (bn1, layer1_0_bn1, ") and "(47 more)" in text
    assert "fix: set placement.sync_batchnorm" in text and len(nodes) == 53
    assert grouped(["node 'a' (Linear): x", "something else"]) == [("node 'a' (Linear): x", ["a"]),
                                                                    ("something else", [])]
    save_project(p, tmp_path / "r.lflow")
    assert main(["plan", str(tmp_path / "r.lflow")]) == 0
    out = capsys.readouterr().out
    assert out.count("BatchNorm2d") == 1 and "53 BatchNorm2d nodes" in out
