"""A node's stage, TP style and checkpointing are its NodeAssignment, named apart from the
project's Placement (pp x dp x tp); the project file keeps the node's own keys, so files
written before and after read the same."""
import json
from pathlib import Path

import pytest

from engine.diagram.graph import ASSIGNMENT_CHANGED, Graph, GraphError, NodeAssignment
from engine.project import Placement, load_project, loads_project

ROOT = Path(__file__).resolve().parents[3]
MLP = ROOT / "resources" / "examples" / "mlp_digits.lflow"


def test_assign_changes_a_nodes_assignment_and_says_so():
    g = Graph()
    g.add_node("Linear", {"in_features": 4, "out_features": 4}, id="fc", stage=1)
    seen = []
    g.subscribe(seen.append)
    assert g.nodes["fc"].assignment == NodeAssignment(stage=1)
    g.assign("fc", stage=0, tp="colwise", checkpoint=True)
    assert g.nodes["fc"].assignment == NodeAssignment(0, "colwise", True)
    assert [(e.kind, e.key, e.old, e.new) for e in seen] == [(ASSIGNMENT_CHANGED, "stage", 1, 0),
                                                             (ASSIGNMENT_CHANGED, "tp", None, "colwise"),
                                                             (ASSIGNMENT_CHANGED, "checkpoint", False, True)]
    with pytest.raises(GraphError, match="unknown node assignment field 'dp'"):
        g.assign("fc", dp=2)  # the mesh is the project's Placement, not a node's
    with pytest.raises(GraphError, match="tp must be one of"):
        g.assign("fc", tp="diagonal")
    g.set_placement("fc", stage=None)  # the older name still works
    assert g.nodes["fc"].assignment.stage is None


def test_the_file_keeps_a_nodes_own_keys_and_older_files_load():
    p = load_project(MLP)
    p.graph.assign("fc1", stage=0, tp="colwise")
    p.placement = p.placement.derive(tp=2)
    d = json.loads(p.dumps())
    node = next(n for n in d["diagram"]["nodes"] if n["id"] == "fc1")
    assert (node["stage"], node["tp"]) == (0, "colwise") and "assignment" not in node
    assert d["placement"] == Placement(tp=2).model_dump(mode="json")
    again = loads_project(p.dumps())
    assert again.graph.nodes["fc1"].assignment == NodeAssignment(0, "colwise") and again.placement.tp == 2
    assert load_project(MLP).dumps() == MLP.read_text()  # an example written before reads and writes the same
