"""Issue 43, items 2-4: imports that check themselves on real tokens, drop dead calls,
keep a value computed once, and name what they cannot bring in (models written like
their public reference code: tests/engine/issue43_models.py)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import engine.interop.module_import as mi
from engine.compile import compile_graph
from engine.interop import InteropError
from engine.interop.module_import import from_module

from real_models import GPT


class TwoTables(nn.Module):
    """Token ids into a 40-row word table and, shifted, a 7-row type table: ids must stay below 7."""

    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(40, 8)
        self.tte = nn.Embedding(7, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, idx):
        return self.head((self.wte(idx) + self.tte(idx)).mean(1))


def _checked_on(monkeypatch):
    seen = []
    real = mi._check_outputs

    def spy(imported, module, samples):
        seen.append([s.clone() for s in samples])
        return real(imported, module, samples)

    monkeypatch.setattr(mi, "_check_outputs", spy)
    return seen


def test_token_inputs_are_checked_on_random_ids_within_the_vocabulary(monkeypatch):
    seen = _checked_on(monkeypatch)
    torch.manual_seed(0)
    from_module(GPT().eval(), [[16]], ["int64"])
    ids = seen[-1][0]
    assert ids.dtype == torch.int64 and ids.min() >= 0 and ids.max() < 40
    assert len(ids.unique()) > 10  # not all zeros: the check sees real tokens
    torch.manual_seed(0)
    from_module(TwoTables().eval(), [[12]], ["int64"])
    ids = seen[-1][0]
    assert ids.max() < 7 and len(ids.unique()) > 3  # the smallest table bounds them
    from_module(TwoTables().eval(), [[12]], ["int64"], vocab=3)  # the user's vocabulary
    assert seen[-1][0].max() < 3
    # seeded: the same ids each time
    from_module(TwoTables().eval(), [[12]], ["int64"])
    assert torch.equal(seen[-1][0], ids)
