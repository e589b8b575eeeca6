"""compiling.narrow_segments: a first piece without parameters joins the piece right after
it, in order (it was prepended to the third piece, and a two-piece graph raised IndexError:
the pop ran before the next piece was indexed)."""
from __future__ import annotations

import torch
from torch import fx, nn

from engine.runtime.compiling import narrow_segments


class ThreePieces(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        x = torch.tanh(torch.relu(x))  # a first piece without parameters, of two nodes
        return self.b(torch.tanh(self.a(x)))


def test_a_parameterless_first_piece_joins_the_next_in_order():
    gm = fx.symbolic_trace(ThreePieces())
    segs = narrow_segments(gm)
    flat = [n.name for s in segs for n in s]
    order = [n.name for n in gm.graph.nodes if n.op == "call_module" or n.op == "call_function"]
    assert flat == order  # every compute node once, in graph order
    assert [[n.name for n in s] for s in segs] == [["relu", "tanh", "a", "tanh_1"], ["b"]]


class TwoPieces(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        return self.a(torch.tanh(torch.relu(x)))


def test_two_pieces_the_first_without_parameters_make_one():
    segs = narrow_segments(fx.symbolic_trace(TwoPieces()))
    assert [[n.name for n in s] for s in segs] == [["relu", "tanh", "a"]]
