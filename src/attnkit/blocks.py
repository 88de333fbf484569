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

from attnkit.attention import MultiHeadAttention


def sinusoidal_positions(length: int, size: int, device=None, start: int = 0) -> Tensor:
    """(length, size) position codes of Vaswani et al. 2017 for positions start ... start + length - 1:
    sin on even, cos on odd channels."""
    position = torch.arange(start, start + length, device=device, dtype=torch.float32).unsqueeze(1)  # (T, 1)
    frequency = torch.exp(torch.arange(0, size, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / size))  # (ceil(M/2),)
    codes = torch.zeros(length, size, device=device)
    codes[:, 0::2] = torch.sin(position * frequency)
    codes[:, 1::2] = torch.cos(position * frequency[: size // 2])
    return codes


class ScaledEmbedding(nn.Embedding):
    """Token embeddings of a Transformer: drawn with standard deviation M^-0.5 and multiplied by sqrt(M) when
    read (Vaswani et al. 2017), so the inputs have unit variance beside the position codes and an output
    layer tied to them starts at the usual scale; the padding row stays zero."""

    def __init__(self, vocab_size: int, size: int, pad_index: int):
        super().__init__(vocab_size, size, padding_idx=pad_index)
        nn.init.normal_(self.weight, std=size**-0.5)
        with torch.no_grad():
            self.weight[pad_index].zero_()
        self.scale = math.sqrt(size)

    def forward(self, ids: Tensor) -> Tensor:
        return super().forward(ids) * self.scale  # (B, T, M)


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


def grid_positions(height: int, width: int, size: int, device=None) -> Tensor:
    """(height * width, size) 2-D position codes of a row-major grid: the first half of the channels
    codes the row, the second half the column, each with :func:`sinusoidal_positions`."""
    half = size // 2
    rows = sinusoidal_positions(height, half, device).repeat_interleave(width, 0)  # (H*W, size/2)
    columns = sinusoidal_positions(width, size - half, device).repeat(height, 1)  # (H*W, size - size/2)
    return torch.cat([rows, columns], 1)


class SelfAttentionLayer(nn.Module):
    """One pre-norm encoder layer: self-attention over the real positions, then the feed-forward layer."""

    compiled_whole = True  # train.compile (attnkit.train.compile_layers)

    def __init__(self, size: int, heads: int, feedforward_size: int, dropout: float):
        super().__init__()
        self.attention_norm = nn.LayerNorm(size)
        self.attention = MultiHeadAttention(size, heads, dropout=dropout)
        self.feedforward_norm = nn.LayerNorm(size)
        self.feedforward = FeedForward(size, feedforward_size, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """x (B, L, M), mask (B, L) True = real -> (B, L, M); padding attends too but nothing attends to it."""
        return self.attend(x, mask)[0]

    def attend(self, x: Tensor, mask: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """:meth:`forward`, and with ``need_weights`` the self-attention weights (B, h, L, L) too."""
        normed = self.attention_norm(x)
        attended, weights = self.attention(normed, *self.attention.keys_values(normed), mask.unsqueeze(1), need_weights=need_weights)
        x = x + self.dropout(attended)
        return x + self.dropout(self.feedforward(self.feedforward_norm(x))), weights


class SelfAttentionStack(nn.Module):
    """N self-attention layers and the final LayerNorm: what a Transformer encoder runs over its inputs."""

    def __init__(self, size: int, heads: int, feedforward_size: int, layers: int, dropout: float):
        super().__init__()
        self.layers = nn.ModuleList(SelfAttentionLayer(size, heads, feedforward_size, dropout) for _ in range(layers))
        self.final_norm = nn.LayerNorm(size)
        xavier_init(self)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x, mask)  # (B, L, M)
        return self.final_norm(x)

    def attention_weights(self, x: Tensor, mask: Tensor) -> list[Tensor]:
        """Every layer's self-attention weights over ``x`` (B, L, M): one (B, h, L, L) per layer, rows the queries."""
        maps = []
        for layer in self.layers:
            x, weights = layer.attend(x, mask, need_weights=True)  # (B, L, M), (B, h, L, L)
            maps.append(weights)
        return maps
