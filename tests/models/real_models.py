"""Real architectures, written the way their public reference code writes them, but
narrow (few channels, small images) so the tests run on two CPU cores.

Each keeps what made it hard to import: ReLU6 and functional pooling (MobileNetV2),
a class token indexed with x[:, 0] (ViT), squeeze-and-excitation's broadcasting Mul
and stochastic depth (EfficientNet, RegNet), permute + LayerNorm + layer scale
(ConvNeXt), functional pooling and concatenated features (DenseNet), ceil_mode pools
(SqueezeNet), and a GPT with an assert on the length, optional targets and the
embedding tied to the head (nanoGPT).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


# ----- ResNet (BasicBlock with a projection shortcut) --------------------------------
class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    def __init__(self, layers=(1, 1), width=8, num_classes=5):
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(width, layers[0])
        self.layer2 = self._make_layer(width * 2, layers[1], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 2, num_classes)

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer2(self.layer1(x))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


class ResNet18(ResNet):
    """torchvision's resnet18 layout: stem, four stages of two basic blocks, head; 8 channels."""

    def __init__(self, width=8, num_classes=10):
        super().__init__(layers=(2, 2), width=width, num_classes=num_classes)
        self.layer3 = self._make_layer(width * 4, 2, stride=2)
        self.layer4 = self._make_layer(width * 8, 2, stride=2)
        self.fc = nn.Linear(width * 8 * BasicBlock.expansion, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class Bottleneck(nn.Module):
    """torchvision's ResNet-50 block: 1x1 reduce, 3x3, 1x1 expand (x4), skip."""
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class ResNet50(nn.Module):
    """torchvision's resnet50 layout (stem, four stages of 3, 4, 6, 3 bottlenecks, head),
    `width` channels in place of 64 so that tests stay small."""

    def __init__(self, layers=(3, 4, 6, 3), width=4, num_classes=10):
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(width, layers[0])
        self.layer2 = self._make_layer(width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(width * 8, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 8 * Bottleneck.expansion, num_classes)

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * Bottleneck.expansion:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * Bottleneck.expansion, 1, stride, bias=False),
                                       nn.BatchNorm2d(planes * Bottleneck.expansion))
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * Bottleneck.expansion
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# ----- MobileNetV2 ---------------------------------------------------------------
class ConvBNReLU(nn.Sequential):
    def __init__(self, inp, oup, kernel_size=3, stride=1, groups=1):
        padding = (kernel_size - 1) // 2
        super().__init__(nn.Conv2d(inp, oup, kernel_size, stride, padding, groups=groups, bias=False),
                         nn.BatchNorm2d(oup), nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    def __init__(self, inp, oup, stride, expand_ratio):
        super().__init__()
        hidden = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup
        layers = [ConvBNReLU(inp, hidden, kernel_size=1)] if expand_ratio != 1 else []
        layers += [ConvBNReLU(hidden, hidden, stride=stride, groups=hidden),
                   nn.Conv2d(hidden, oup, 1, 1, 0, bias=False), nn.BatchNorm2d(oup)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, num_classes=5):
        super().__init__()
        self.features = nn.Sequential(ConvBNReLU(3, 8, stride=2), InvertedResidual(8, 8, 1, 1),
                                      InvertedResidual(8, 12, 2, 6), InvertedResidual(12, 12, 1, 6), ConvBNReLU(12, 32, 1))
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(32, num_classes))

    def forward(self, x):
        x = self.features(x)
        x = nn.functional.adaptive_avg_pool2d(x, (1, 1))
        return self.classifier(torch.flatten(x, 1))


# ----- EfficientNet / RegNet pieces: squeeze-and-excitation, stochastic depth -------------
class SqueezeExcitation(nn.Module):
    def __init__(self, channels, squeeze):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.activation = nn.SiLU()
        self.scale_activation = nn.Sigmoid()

    def forward(self, x):
        scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return scale * x  # (B, C, 1, 1) * (B, C, H, W): broadcasting


def stochastic_depth(x, p: float, training: bool = True):
    if not training or p == 0.0:
        return x
    noise = torch.empty([x.shape[0]] + [1] * (x.ndim - 1), dtype=x.dtype, device=x.device).bernoulli_(1 - p)
    return x * noise.div_(1 - p)


class StochasticDepth(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        return stochastic_depth(x, self.p, self.training)


class MBConv(nn.Module):
    def __init__(self, c, expand=4, sd=0.1):
        super().__init__()
        h = c * expand
        self.block = nn.Sequential(
            nn.Sequential(nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), nn.SiLU()),
            nn.Sequential(nn.Conv2d(h, h, 3, padding=1, groups=h, bias=False), nn.BatchNorm2d(h), nn.SiLU()),
            SqueezeExcitation(h, max(1, c // 4)),
            nn.Sequential(nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c)))
        self.stochastic_depth = StochasticDepth(sd)

    def forward(self, x):
        return x + self.stochastic_depth(self.block(x))


class EfficientNet(nn.Module):
    def __init__(self, num_classes=5):
        super().__init__()
        self.features = nn.Sequential(nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.SiLU()),
                                      MBConv(8), MBConv(8))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.2, inplace=True), nn.Linear(8, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class RegNetBlock(nn.Module):
    """RegNet's Y block: 1x1, grouped 3x3, squeeze-excitation, 1x1, residual."""

    def __init__(self, c, group_width=4):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True))
        self.b = nn.Sequential(nn.Conv2d(c, c, 3, padding=1, groups=c // group_width, bias=False), nn.BatchNorm2d(c),
                               nn.ReLU(inplace=True))
        self.se = SqueezeExcitation(c, c // 4)
        self.c = nn.Sequential(nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c))
        self.activation = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.activation(x + self.c(self.se(self.b(self.a(x)))))


class RegNet(nn.Module):
    def __init__(self, num_classes=5):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True))
        self.trunk_output = nn.Sequential(RegNetBlock(8), RegNetBlock(8))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x):
        x = self.avgpool(self.trunk_output(self.stem(x)))
        return self.fc(x.flatten(start_dim=1))


# ----- ConvNeXt: permute-based layer norm and layer scale ---------------------------
class LayerNorm2d(nn.LayerNorm):
    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class CNBlock(nn.Module):
    def __init__(self, dim, layer_scale=1e-6):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(layer_scale * torch.ones(dim))

    def forward(self, x):
        inp = x
        x = self.dwconv(x).permute(0, 2, 3, 1)  # (N, C, H, W) -> (N, H, W, C)
        x = self.pwconv2(self.act(self.pwconv1(self.norm(x))))
        x = (self.gamma * x).permute(0, 3, 1, 2)
        return inp + x


class ConvNeXt(nn.Module):
    def __init__(self, num_classes=5, dim=8):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, dim, 4, 4), LayerNorm2d(dim, eps=1e-6))
        self.stages = nn.Sequential(CNBlock(dim), CNBlock(dim))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.head(self.norm(x.mean([-2, -1])))  # global average pooling, (N, C, H, W) -> (N, C)


# ----- DenseNet: concatenated features, functional pooling -------------------------------
class DenseLayer(nn.Module):
    def __init__(self, cin, growth, bn_size=2):
        super().__init__()
        self.norm1 = nn.BatchNorm2d(cin)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(cin, bn_size * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False)

    def forward(self, inputs):
        prev = torch.cat(inputs, 1) if isinstance(inputs, list) else inputs
        out = self.conv1(self.relu1(self.norm1(prev)))
        return self.conv2(self.relu2(self.norm2(out)))


class DenseBlock(nn.ModuleDict):
    def __init__(self, n, cin, growth):
        super().__init__()
        for i in range(n):
            self.add_module(f"denselayer{i + 1}", DenseLayer(cin + i * growth, growth))

    def forward(self, init_features):
        features = [init_features]
        for _, layer in self.items():
            features.append(layer(features))
        return torch.cat(features, 1)


class DenseNet(nn.Module):
    def __init__(self, num_classes=5, growth=4):
        super().__init__()
        self.features = nn.Sequential()
        self.features.add_module("conv0", nn.Conv2d(3, 8, 3, 1, 1, bias=False))
        self.features.add_module("norm0", nn.BatchNorm2d(8))
        self.features.add_module("relu0", nn.ReLU(inplace=True))
        self.features.add_module("pool0", nn.MaxPool2d(kernel_size=3, stride=2, padding=1))
        self.features.add_module("denseblock1", DenseBlock(3, 8, growth))
        self.features.add_module("transition1", nn.Sequential(nn.BatchNorm2d(8 + 3 * growth), nn.ReLU(inplace=True),
                                                              nn.Conv2d(8 + 3 * growth, 8, 1, bias=False),
                                                              nn.AvgPool2d(2, 2)))
        self.features.add_module("norm5", nn.BatchNorm2d(8))
        self.classifier = nn.Linear(8, num_classes)

    def forward(self, x):
        out = F.relu(self.features(x), inplace=True)
        out = F.adaptive_avg_pool2d(out, (1, 1))
        return self.classifier(torch.flatten(out, 1))


# ----- SqueezeNet: ceil_mode pools -------------------------------------------------------
class Fire(nn.Module):
    def __init__(self, inplanes, squeeze, e1, e3):
        super().__init__()
        self.squeeze = nn.Conv2d(inplanes, squeeze, 1)
        self.squeeze_activation = nn.ReLU(inplace=True)
        self.expand1x1 = nn.Conv2d(squeeze, e1, 1)
        self.expand1x1_activation = nn.ReLU(inplace=True)
        self.expand3x3 = nn.Conv2d(squeeze, e3, 3, padding=1)
        self.expand3x3_activation = nn.ReLU(inplace=True)

    def forward(self, x):
        x = self.squeeze_activation(self.squeeze(x))
        return torch.cat([self.expand1x1_activation(self.expand1x1(x)), self.expand3x3_activation(self.expand3x3(x))], 1)


class SqueezeNet(nn.Module):
    def __init__(self, num_classes=5):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2), nn.ReLU(inplace=True),
                                      nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
                                      Fire(16, 4, 8, 8), nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
                                      Fire(16, 4, 8, 8))
        self.classifier = nn.Sequential(nn.Dropout(p=0.5), nn.Conv2d(16, num_classes, 1), nn.ReLU(inplace=True),
                                        nn.AdaptiveAvgPool2d((1, 1)))

    def forward(self, x):
        return torch.flatten(self.classifier(self.features(x)), 1)


# ----- ViT: class token, positional embedding, x[:, 0] -------------------------------------
class EncoderBlock(nn.Module):
    def __init__(self, num_heads, hidden_dim, mlp_dim):
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden_dim, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(hidden_dim, num_heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(hidden_dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(hidden_dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, hidden_dim))

    def forward(self, input):
        torch._assert(input.dim() == 3, f"Expected (batch_size, seq_length, hidden_dim) got {input.shape}")
        x = self.ln_1(input)
        x, _ = self.self_attention(x, x, x, need_weights=False)
        x = x + input
        return x + self.mlp(self.ln_2(x))


class VisionTransformer(nn.Module):
    def __init__(self, image_size=16, patch_size=4, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32, num_classes=5):
        super().__init__()
        self.patch_size, self.hidden_dim = patch_size, hidden_dim
        self.conv_proj = nn.Conv2d(3, hidden_dim, kernel_size=patch_size, stride=patch_size)
        seq_length = (image_size // patch_size) ** 2 + 1
        self.class_token = nn.Parameter(torch.zeros(1, 1, hidden_dim))
        self.pos_embedding = nn.Parameter(torch.empty(1, seq_length, hidden_dim).normal_(std=0.02))
        self.layers = nn.Sequential(*[EncoderBlock(num_heads, hidden_dim, mlp_dim) for _ in range(num_layers)])
        self.ln = nn.LayerNorm(hidden_dim, eps=1e-6)
        self.heads = nn.Sequential(nn.Linear(hidden_dim, num_classes))

    def _process_input(self, x):
        n, c, h, w = x.shape
        torch._assert(h == w, f"Wrong image height! Expected square images, got {h}x{w}")
        x = self.conv_proj(x).reshape(n, self.hidden_dim, (h // self.patch_size) * (w // self.patch_size))
        return x.permute(0, 2, 1)

    def forward(self, x):
        x = self._process_input(x)
        n = x.shape[0]
        batch_class_token = self.class_token.expand(n, -1, -1)
        x = torch.cat([batch_class_token, x], dim=1)
        x = self.ln(self.layers(x + self.pos_embedding))
        return self.heads(x[:, 0])


# ----- GPT (nanoGPT style) --------------------------------------------------------------------
class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        assert n_embd % n_head == 0
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head, self.n_embd = n_head, n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=16):
        super().__init__()
        self.block_size = block_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd), wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)]), ln_f=nn.LayerNorm(n_embd)))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def trunk(self, idx):
        """The final hidden states (nanoGPT's forward up to lm_head)."""
        device = idx.device
        b, t = idx.size()
        assert t <= self.block_size, f"Cannot forward sequence of length {t}, block size is only {self.block_size}"
        pos = torch.arange(0, t, dtype=torch.long, device=device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.transformer.ln_f(x)

    def forward(self, idx, targets=None):
        x = self.trunk(idx)
        if targets is not None:
            logits = self.lm_head(x)
            return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return self.lm_head(x)


class SharedTwice(nn.Module):
    """One Linear called twice: its weights must stay one tensor."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        return self.out(torch.tanh(self.fc(torch.tanh(self.fc(x)))))


# name: (constructor, input shape without the batch, dtype)
VISION = {
    "resnet": (ResNet, [3, 16, 16]),
    "mobilenet_v2": (MobileNetV2, [3, 16, 16]),
    "efficientnet": (EfficientNet, [3, 16, 16]),
    "regnet": (RegNet, [3, 16, 16]),
    "convnext": (ConvNeXt, [3, 16, 16]),
    "densenet": (DenseNet, [3, 16, 16]),
    "squeezenet": (SqueezeNet, [3, 33, 33]),
    "vit": (VisionTransformer, [3, 16, 16]),
}
