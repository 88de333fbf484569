"""Transformer building blocks shared by the self-attention encoders and the Transformer decoder.

Legend: B batch, T positions, M model size, F feed-forward size.

Blocks are pre-norm (Xiong et al. 2020; Joey NMT and fairseq's default for new models): each
sublayer reads LayerNorm(x) and adds its dropped-out output to x, which trains without a
long learning-rate warm-up, and the stack ends in one more LayerNorm.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def sinusoidal_positions(length: int, size: int, device=None, start: int = 0) -> Tensor:
    """(length, size) position codes of Vaswani et al. 2017 for positions start ... start + length - 1:
    sin on even, cos on odd channels."""
    position = torch.arange(start, start + length, device=device, dtype=torch.float32).unsqueeze(1)  # (T, 1)
    frequency = torch.exp(torch.arange(0, size, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / size))  # (ceil(M/2),)
    codes = torch.zeros(length, size, device=device)
    codes[:, 0::2] = torch.sin(position * frequency)
    codes[:, 1::2] = torch.cos(position * frequency[: size // 2])
    return codes


class FeedForward(nn.Module):
    """The position-wise feed-forward layer: W2 dropout(relu(W1 x))."""

    def __init__(self, size: int, inner_size: int, dropout: float):
        super().__init__()
        self.inner = nn.Linear(size, inner_size)
        self.outer = nn.Linear(inner_size, size)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.outer(self.dropout(torch.relu(self.inner(x))))  # (B, T, M)


def xavier_init(module: nn.Module) -> None:
    """Glorot-uniform weights and zero biases for every linear layer under ``module`` (the usual
    Transformer initialisation; PyTorch's default is scaled for ReLU networks without residuals)."""
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            nn.init.xavier_uniform_(layer.weight)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
