"""Models for issue 43's import fixes, written the way their public reference code
writes them (Hugging Face BERT/T5, torchvision ConvNeXt/GoogLeNet/Swin, nanoGPT), but
narrow so the tests run on two CPU cores."""
from __future__ import annotations

import math

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
            x = self.trunk(idx)
            if targets is not None:
                logits = self.lm_head(x)
                return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
            return self.lm_head(x[:, [-1], :])  # inference-time mini-optimization: only the last position

    return GPTLast()


def gpt_last_logits_on_tokens(folder):
    """gpt_last_logits imported by module import (16 tokens in, vocabulary 40), saved in
    `folder` as gpt_last.lflow with a token file of per-position targets beside it (the
    data a user of nanoGPT has): (the project file's path, the import)."""
    import json

    import numpy as np

    from engine.interop import save_imported
    from engine.interop.module.importer import from_module

    torch.manual_seed(0)
    imp = from_module(gpt_last_logits().eval(), [[16]], ["int64"])
    path = save_imported(imp, folder / "gpt_last.lflow")
    toks = folder / "tokens"
    toks.mkdir()
    rng = np.random.default_rng(0)
    for name, n in (("train.bin", 4000), ("val.bin", 400)):
        rng.integers(0, 40, n).astype(np.uint16).tofile(toks / name)
    (toks / "meta.json").write_text(json.dumps({"vocab_size": 40, "dtype": "uint16"}))
    d = json.loads(path.read_text())
    d["training"]["dataset"] = {"kind": "token_file", "path": "tokens", "seq_len": 16}
    path.write_text(json.dumps(d))
    return path, imp


# ----- T5-style encoder: relative position bias computed in the first block, handed on -------
class T5LayerNorm(nn.Module):
    """T5's RMS norm: no mean, no bias."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states


class T5Attention(nn.Module):
    def __init__(self, d_model, n_heads, has_relative_attention_bias=False, num_buckets=8, max_distance=16):
        super().__init__()
        self.n_heads, self.d_kv = n_heads, d_model // n_heads
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.q = nn.Linear(d_model, d_model, bias=False)
        self.k = nn.Linear(d_model, d_model, bias=False)
        self.v = nn.Linear(d_model, d_model, bias=False)
        self.o = nn.Linear(d_model, d_model, bias=False)
        self.has_relative_attention_bias = has_relative_attention_bias
        if has_relative_attention_bias:
            self.relative_attention_bias = nn.Embedding(num_buckets, n_heads)

    @staticmethod
    def _relative_position_bucket(relative_position, num_buckets=32, max_distance=128):
        # bidirectional
        num_buckets //= 2
        relative_buckets = (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
        max_exact = num_buckets // 2
        is_small = relative_position < max_exact
        relative_position_if_large = max_exact + (
            torch.log(relative_position.float() / max_exact) / math.log(max_distance / max_exact)
            * (num_buckets - max_exact)).to(torch.long)
        relative_position_if_large = torch.min(
            relative_position_if_large, torch.full_like(relative_position_if_large, num_buckets - 1))
        relative_buckets += torch.where(is_small, relative_position, relative_position_if_large)
        return relative_buckets

    def compute_bias(self, query_length, key_length, device=None):
        context_position = torch.arange(query_length, dtype=torch.long, device=device)[:, None]
        memory_position = torch.arange(key_length, dtype=torch.long, device=device)[None, :]
        relative_position = memory_position - context_position  # (query_length, key_length)
        relative_position_bucket = self._relative_position_bucket(
            relative_position, num_buckets=self.num_buckets, max_distance=self.max_distance)
        values = self.relative_attention_bias(relative_position_bucket)  # (q, k, n_heads)
        return values.permute([2, 0, 1]).unsqueeze(0)  # (1, n_heads, q, k)

    def forward(self, hidden_states, position_bias=None):
        B, T, _ = hidden_states.shape

        def shape(x):
            return x.view(B, -1, self.n_heads, self.d_kv).transpose(1, 2)

        q, k, v = shape(self.q(hidden_states)), shape(self.k(hidden_states)), shape(self.v(hidden_states))
        if position_bias is None:
            position_bias = self.compute_bias(T, T, device=hidden_states.device)
        # T5 does not scale the scores: scale=1.0, the bias as a float mask
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=position_bias, scale=1.0)
        out = out.transpose(1, 2).contiguous().view(B, T, -1)
        return self.o(out), position_bias


class T5Block(nn.Module):
    def __init__(self, d_model, n_heads, has_relative_attention_bias):
        super().__init__()
        self.layer_norm = T5LayerNorm(d_model)
        self.SelfAttention = T5Attention(d_model, n_heads, has_relative_attention_bias)
        self.ff_norm = T5LayerNorm(d_model)
        self.wi = nn.Linear(d_model, 2 * d_model, bias=False)
        self.wo = nn.Linear(2 * d_model, d_model, bias=False)

    def forward(self, hidden_states, position_bias=None):
        attn, position_bias = self.SelfAttention(self.layer_norm(hidden_states), position_bias)
        hidden_states = hidden_states + attn
        hidden_states = hidden_states + self.wo(F.relu(self.wi(self.ff_norm(hidden_states))))
        return hidden_states, position_bias


class T5Encoder(nn.Module):
    def __init__(self, vocab_size=32, d_model=16, n_heads=2, num_layers=3, num_classes=4):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_size, d_model)
        self.block = nn.ModuleList([T5Block(d_model, n_heads, has_relative_attention_bias=bool(i == 0))
                                    for i in range(num_layers)])
        self.final_layer_norm = T5LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, input_ids):
        hidden_states = self.embed_tokens(input_ids)
        position_bias = None
        for layer in self.block:  # the first block computes the bias; the others are handed it
            hidden_states, position_bias = layer(hidden_states, position_bias)
        return self.head(self.final_layer_norm(hidden_states).mean(1))


# ----- torchvision-style GoogLeNet: auxiliary classifiers that run only in training ---------
class BasicConv2d(nn.Module):
    def __init__(self, cin, cout, **kwargs):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, bias=False, **kwargs)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)), inplace=True)


class Inception(nn.Module):
    def __init__(self, cin, ch1x1, ch3x3red, ch3x3, ch5x5red, ch5x5, pool_proj):
        super().__init__()
        self.branch1 = BasicConv2d(cin, ch1x1, kernel_size=1)
        self.branch2 = nn.Sequential(BasicConv2d(cin, ch3x3red, kernel_size=1),
                                     BasicConv2d(ch3x3red, ch3x3, kernel_size=3, padding=1))
        self.branch3 = nn.Sequential(BasicConv2d(cin, ch5x5red, kernel_size=1),
                                     BasicConv2d(ch5x5red, ch5x5, kernel_size=3, padding=1))
        self.branch4 = nn.Sequential(nn.MaxPool2d(kernel_size=3, stride=1, padding=1, ceil_mode=True),
                                     BasicConv2d(cin, pool_proj, kernel_size=1))

    def forward(self, x):
        return torch.cat([self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x)], 1)


class InceptionAux(nn.Module):
    def __init__(self, cin, num_classes):
        super().__init__()
        self.conv = BasicConv2d(cin, 16, kernel_size=1)
        self.fc1 = nn.Linear(16 * 2 * 2, 32)
        self.fc2 = nn.Linear(32, num_classes)

    def forward(self, x):
        x = F.adaptive_avg_pool2d(x, (2, 2))
        x = torch.flatten(self.conv(x), 1)
        return self.fc2(F.dropout(F.relu(self.fc1(x), inplace=True), 0.7, training=self.training))


class GoogLeNet(nn.Module):
    def __init__(self, num_classes=5, aux_logits=True):
        super().__init__()
        self.aux_logits = aux_logits
        self.conv1 = BasicConv2d(3, 16, kernel_size=3, stride=2, padding=1)
        self.inception3a = Inception(16, 8, 8, 8, 4, 4, 4)  # -> 24 channels
        self.inception4a = Inception(24, 8, 8, 8, 4, 4, 4)
        self.inception4b = Inception(24, 8, 8, 8, 4, 4, 4)
        self.aux1 = InceptionAux(24, num_classes) if aux_logits else None
        self.aux2 = InceptionAux(24, num_classes) if aux_logits else None
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(24, num_classes)

    def _forward(self, x):
        x = self.inception3a(self.conv1(x))
        x = self.inception4a(x)
        aux1 = None
        if self.aux1 is not None and self.training:
            aux1 = self.aux1(x)
        x = self.inception4b(x)
        aux2 = None
        if self.aux2 is not None and self.training:
            aux2 = self.aux2(x)
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x), aux2, aux1

    def forward(self, x):
        x, aux2, aux1 = self._forward(x)
        if self.training and self.aux_logits:
            return x, aux2, aux1  # (torchvision: GoogLeNetOutputs)
        return x


# ----- torchvision-style Swin: shifted windows, the attention mask built in forward ------------
def _get_relative_position_bias(relative_position_bias_table, relative_position_index, window_size):
    N = window_size[0] * window_size[1]
    relative_position_bias = relative_position_bias_table[relative_position_index]
    relative_position_bias = relative_position_bias.view(N, N, -1)
    return relative_position_bias.permute(2, 0, 1).contiguous().unsqueeze(0)


def shifted_window_attention(input, qkv_weight, proj_weight, relative_position_bias, window_size, num_heads,
                             shift_size, qkv_bias=None, proj_bias=None):
    B, H, W, C = input.shape
    # pad feature maps to multiples of window size
    pad_r = (window_size[1] - W % window_size[1]) % window_size[1]
    pad_b = (window_size[0] - H % window_size[0]) % window_size[0]
    x = F.pad(input, (0, 0, 0, pad_r, 0, pad_b))
    _, pad_H, pad_W, _ = x.shape
    shift_size = shift_size.copy()
    # if window size is larger than feature size, there is no need to shift window
    if window_size[0] >= pad_H:
        shift_size[0] = 0
    if window_size[1] >= pad_W:
        shift_size[1] = 0
    # cyclic shift
    if sum(shift_size) > 0:
        x = torch.roll(x, shifts=(-shift_size[0], -shift_size[1]), dims=(1, 2))
    # partition windows
    num_windows = (pad_H // window_size[0]) * (pad_W // window_size[1])
    x = x.view(B, pad_H // window_size[0], window_size[0], pad_W // window_size[1], window_size[1], C)
    x = x.permute(0, 1, 3, 2, 4, 5).reshape(B * num_windows, window_size[0] * window_size[1], C)  # B*nW, Ws*Ws, C
    # multi-head attention
    qkv = F.linear(x, qkv_weight, qkv_bias)
    qkv = qkv.reshape(x.size(0), x.size(1), 3, num_heads, C // num_heads).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    q = q * (C // num_heads) ** -0.5
    attn = q.matmul(k.transpose(-2, -1))
    attn = attn + relative_position_bias  # add relative position bias
    if sum(shift_size) > 0:
        # generate attention mask
        attn_mask = x.new_zeros((pad_H, pad_W))
        h_slices = ((0, -window_size[0]), (-window_size[0], -shift_size[0]), (-shift_size[0], None))
        w_slices = ((0, -window_size[1]), (-window_size[1], -shift_size[1]), (-shift_size[1], None))
        count = 0
        for h in h_slices:
            for w in w_slices:
                attn_mask[h[0]:h[1], w[0]:w[1]] = count
                count += 1
        attn_mask = attn_mask.view(pad_H // window_size[0], window_size[0], pad_W // window_size[1], window_size[1])
        attn_mask = attn_mask.permute(0, 2, 1, 3).reshape(num_windows, window_size[0] * window_size[1])
        attn_mask = attn_mask.unsqueeze(1) - attn_mask.unsqueeze(2)
        attn_mask = attn_mask.masked_fill(attn_mask != 0, float(-100.0)).masked_fill(attn_mask == 0, float(0.0))
        attn = attn.view(x.size(0) // num_windows, num_windows, num_heads, x.size(1), x.size(1))
        attn = attn + attn_mask.unsqueeze(1).unsqueeze(0)
        attn = attn.view(-1, num_heads, x.size(1), x.size(1))
    attn = F.softmax(attn, dim=-1)
    x = attn.matmul(v).transpose(1, 2).reshape(x.size(0), x.size(1), C)
    x = F.linear(x, proj_weight, proj_bias)
    # reverse windows
    x = x.view(B, pad_H // window_size[0], pad_W // window_size[1], window_size[0], window_size[1], C)
    x = x.permute(0, 1, 3, 2, 4, 5).reshape(B, pad_H, pad_W, C)
    # reverse cyclic shift
    if sum(shift_size) > 0:
        x = torch.roll(x, shifts=(shift_size[0], shift_size[1]), dims=(1, 2))
    # unpad features
    return x[:, :H, :W, :].contiguous()


class ShiftedWindowAttention(nn.Module):
    def __init__(self, dim, window_size, shift_size, num_heads):
        super().__init__()
        self.window_size, self.shift_size, self.num_heads = window_size, shift_size, num_heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * window_size[0] - 1) * (2 * window_size[1] - 1), num_heads))
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)
        coords = torch.stack(torch.meshgrid(torch.arange(window_size[0]), torch.arange(window_size[1]), indexing="ij"))
        coords_flatten = torch.flatten(coords, 1)  # 2, Wh*Ww
        relative_coords = coords_flatten[:, :, None] - coords_flatten[:, None, :]  # 2, Wh*Ww, Wh*Ww
        relative_coords = relative_coords.permute(1, 2, 0).contiguous()  # Wh*Ww, Wh*Ww, 2
        relative_coords[:, :, 0] += window_size[0] - 1  # shift to start from 0
        relative_coords[:, :, 1] += window_size[1] - 1
        relative_coords[:, :, 0] *= 2 * window_size[1] - 1
        self.register_buffer("relative_position_index", relative_coords.sum(-1).flatten())  # Wh*Ww*Wh*Ww

    def forward(self, x):
        bias = _get_relative_position_bias(self.relative_position_bias_table, self.relative_position_index,
                                           self.window_size)
        return shifted_window_attention(x, self.qkv.weight, self.proj.weight, bias, self.window_size, self.num_heads,
                                        shift_size=self.shift_size, qkv_bias=self.qkv.bias, proj_bias=self.proj.bias)


class SwinTransformerBlock(nn.Module):
    def __init__(self, dim, num_heads, window_size, shift_size, mlp_ratio=2.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = ShiftedWindowAttention(dim, window_size, shift_size, num_heads)
        self.stochastic_depth = StochasticDepth(0.0, "row")
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, int(dim * mlp_ratio)), nn.GELU(), nn.Linear(int(dim * mlp_ratio), dim))

    def forward(self, x):
        x = x + self.stochastic_depth(self.attn(self.norm1(x)))
        return x + self.stochastic_depth(self.mlp(self.norm2(x)))


class SwinTransformer(nn.Module):
    def __init__(self, embed_dim=16, num_heads=2, window_size=(4, 4), num_classes=5):
        super().__init__()
        self.features = nn.Sequential(
            nn.Sequential(nn.Conv2d(3, embed_dim, kernel_size=4, stride=4), Permute([0, 2, 3, 1]), nn.LayerNorm(embed_dim)),
            nn.Sequential(*[SwinTransformerBlock(embed_dim, num_heads, list(window_size),
                                                 [0 if i % 2 == 0 else w // 2 for w in window_size]) for i in range(2)]))
        self.norm = nn.LayerNorm(embed_dim)
        self.permute = Permute([0, 3, 1, 2])  # B H W C -> B C H W
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten(1)
        self.head = nn.Linear(embed_dim, num_classes)

    def forward(self, x):
        x = self.permute(self.norm(self.features(x)))
        return self.head(self.flatten(self.avgpool(x)))
