import pytest

from engine.diagram.graph import Graph, GraphError


def test_events_and_undo_data():
    g = Graph()
    seen = []
    g.subscribe(lambda ev: seen.append((ev.kind, ev.node or (ev.edge and ev.edge.dst))))
    g.add_node("Input", {"shape": [4]}, id="x")
    g.add_node("ReLU", id="r")
    e = g.connect("x", "out", "r", "in")
    g.set_param("r", "foo", 1)
    g.move("r", (10, 20))
    g.set_placement("r", stage=1, tp="replicate")
    node, edges = g.remove_node("r")
    assert edges == [e] and node.stage == 1
    kinds = [k for k, _ in seen]
    assert kinds == ["node_added", "node_added", "edge_added", "param_changed", "moved",
                     "placement_changed", "placement_changed", "edge_removed", "node_removed"]


def test_topo_order_is_stable_and_cycles_are_found():
    g = Graph()
    for n in "abcd":
        g.add_node("ReLU", id=n)
    g.connect("a", "out", "c", "in")
    g.connect("b", "out", "d", "in")
    assert g.topo_order() == ["a", "b", "c", "d"]
    with pytest.raises(GraphError, match="cycle"):
        g.connect("c", "out", "a", "in")


def test_rename_and_ids():
    g = Graph()
    g.add_node("Input", {"shape": [4]}, id="x")
    g.add_node("ReLU", id="r")
    g.connect("x", "out", "r", "in")
    g.rename_node("r", "act")
    assert g.edges[0].dst == "act" and list(g.nodes) == ["x", "act"]
    with pytest.raises(GraphError, match="not a valid node name"):
        g.add_node("ReLU", id="1bad")
    with pytest.raises(GraphError, match="already exists"):
        g.add_node("ReLU", id="x")
    assert g.unique_id("Linear") == "linear1"


def test_roundtrip_and_concat_ports_shrink():
    g = Graph()
    g.add_node("Concat", {"num_inputs": 3}, id="cat")
    for i in range(3):
        g.add_node("Input", {"shape": [2]}, id=f"x{i}")
        g.connect(f"x{i}", "out", "cat", f"in{i}")
    assert Graph.from_dict(g.to_dict()) == g
    g.set_param("cat", "num_inputs", 2)
    assert sorted(e.dst_port for e in g.edges) == ["in0", "in1"]
