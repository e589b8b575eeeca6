"""Models for issue 43's import fixes, written the way their public reference code
writes them (Hugging Face BERT/T5, torchvision ConvNeXt/GoogLeNet/Swin, nanoGPT), but
narrow so the tests run on two CPU cores."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


# ----- Hugging Face-style encoder: mask helpers whose results are never used ---------------
class HFEncoder(nn.Module):
    """BERT-style: builds an extended attention mask and token-type ids that its SDPA path
    then ignores (get_extended_attention_mask's arange/unsqueeze chain)."""

    def __init__(self, vocab_size=30, hidden=16, heads=2, max_positions=32):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden)
        self.position_embeddings = nn.Embedding(max_positions, hidden)
        self.layer = nn.TransformerEncoderLayer(hidden, heads, 2 * hidden, dropout=0.0, batch_first=True)
        self.pooler = nn.Linear(hidden, 3)

    def get_extended_attention_mask(self, attention_mask):
        ext = attention_mask[:, None, None, :]  # (B, 1, 1, T)
        return (1.0 - ext.to(torch.float32)) * torch.finfo(torch.float32).min

    def forward(self, input_ids):
        B, T = input_ids.shape
        attention_mask = torch.ones((B, T), device=input_ids.device)
        extended = self.get_extended_attention_mask(attention_mask)  # noqa: F841 - unused, as in the source
        token_type_ids = torch.zeros_like(input_ids)  # noqa: F841
        position_ids = torch.arange(T, device=input_ids.device).unsqueeze(0).expand(B, -1)
        h = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
        return self.pooler(self.layer(h)[:, 0])


# ----- torchvision-style ConvNeXt: Permute modules, layer scale (C, 1, 1), stochastic depth ----
class Permute(nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.dims = dims

    def forward(self, x):
        return torch.permute(x, self.dims)


class LayerNorm2d(nn.LayerNorm):
    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


def stochastic_depth(x, p: float, mode: str, training: bool = True):
    if not training or p == 0.0:
        return x
    size = [x.shape[0]] + [1] * (x.ndim - 1) if mode == "row" else [1] * x.ndim
    noise = torch.empty(size, dtype=x.dtype, device=x.device).bernoulli_(1.0 - p)
    return x * noise.div_(1.0 - p)


class StochasticDepth(nn.Module):
    def __init__(self, p: float, mode: str):
        super().__init__()
        self.p, self.mode = p, mode

    def forward(self, x):
        return stochastic_depth(x, self.p, self.mode, self.training)


class CNBlock(nn.Module):
    def __init__(self, dim, layer_scale=1e-6, stochastic_depth_prob=0.0):
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim, bias=True),
            Permute([0, 2, 3, 1]),
            nn.LayerNorm(dim, eps=1e-6),
            nn.Linear(dim, 4 * dim, bias=True),
            nn.GELU(),
            nn.Linear(4 * dim, dim, bias=True),
            Permute([0, 3, 1, 2]),
        )
        self.layer_scale = nn.Parameter(torch.ones(dim, 1, 1) * layer_scale)
        self.stochastic_depth = StochasticDepth(stochastic_depth_prob, "row")

    def forward(self, x):
        result = self.layer_scale * self.block(x)
        return self.stochastic_depth(result) + x


class ConvNeXtTV(nn.Module):
    def __init__(self, dim=8, num_classes=5):
        super().__init__()
        self.features = nn.Sequential(
            nn.Sequential(nn.Conv2d(3, dim, 4, 4), LayerNorm2d(dim, eps=1e-6)),
            nn.Sequential(CNBlock(dim, layer_scale=0.5), CNBlock(dim, layer_scale=0.5)),
            nn.Sequential(LayerNorm2d(dim, eps=1e-6), nn.Conv2d(dim, 2 * dim, 2, 2)),
            nn.Sequential(CNBlock(2 * dim, layer_scale=0.5)))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(LayerNorm2d(2 * dim, eps=1e-6), nn.Flatten(1), nn.Linear(2 * dim, num_classes))

    def forward(self, x):
        return self.classifier(self.avgpool(self.features(x)))


# ----- nanoGPT's inference forward: only the last position's logits -------------------------
def gpt_last_logits():
    """nanoGPT's GPT whose forward, given no targets, returns lm_head(x[:, [-1], :]): (B, 1, vocab)."""
    from real_models import GPT

    class GPTLast(GPT):
        def forward(self, idx, targets=None):
            b, t = idx.size()
            assert t <= self.block_size, f"Cannot forward sequence of length {t}, block size is only {self.block_size}"
            pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
            x = self.transformer.wte(idx) + self.transformer.wpe(pos)
            for block in self.transformer.h:
                x = block(x)
            x = self.transformer.ln_f(x)
            if targets is not None:
                logits = self.lm_head(x)
                return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
            return self.lm_head(x[:, [-1], :])  # inference-time mini-optimization: only the last position

    return GPTLast()
