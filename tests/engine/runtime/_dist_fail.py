"""A user's custom layer with a bug that shows on one rank only (for the launcher test)."""
import os

from torch import nn


class FailsOnRank1(nn.Module):
    def forward(self, x):
        if os.environ.get("RANK") == "1":
            raise RuntimeError("custom layer broke on rank 1")
        return x
