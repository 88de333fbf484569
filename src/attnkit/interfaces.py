"""The encoder contract: what every encoder hands to the shared decoder.

Legend: B batch, S source length, L memory length (S tokens or H*W cells),
D memory size, H x W image grid.

After the encoder nothing branches on modality: the decoder, search, losses and
attention statistics read ``memory``, ``mask`` and ``init_state``; only plots
read ``layout``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol, Union, runtime_checkable

import torch
from torch import Tensor


@dataclass(frozen=True)
class Tokens:
    """Memory positions are source tokens."""

    lengths: Tensor  # (B,) number of real tokens per row
    tokens: tuple[tuple[str, ...], ...] | None = None  # source words, for plots


@dataclass(frozen=True)
class Grid:
    """Memory positions are the cells of an H x W feature map, row-major."""

    height: int
    width: int


Layout = Union[Tokens, Grid]


@dataclass(frozen=True)
class EncoderOutput:
    """What the decoder attends over.

    Mask convention: ``True`` marks a real position; padding is ``False`` and
    receives exactly zero attention weight.
    """

    memory: Tensor  # (B, L, D)
    mask: Tensor  # (B, L) bool
    init_state: Tensor  # (B, D_init) summary the decoder's bridge maps to its first state
    layout: Layout

    def __post_init__(self) -> None:
        batch, length, _ = self.memory.shape
        if self.mask.shape != (batch, length) or self.mask.dtype != torch.bool:
            raise ValueError(f"mask must be bool of shape {(batch, length)}, got {self.mask.dtype} {tuple(self.mask.shape)}")
        if self.init_state.dim() != 2 or self.init_state.shape[0] != batch:
            raise ValueError(f"init_state must be (B={batch}, D), got {tuple(self.init_state.shape)}")

    @property
    def batch_size(self) -> int:
        return self.memory.shape[0]

    def select(self, index: Tensor) -> "EncoderOutput":
        """Rows ``index`` of the batch (used to expand a batch for beam search)."""
        layout = self.layout
        if isinstance(layout, Tokens):
            tokens = None if layout.tokens is None else tuple(layout.tokens[i] for i in index.tolist())
            layout = Tokens(layout.lengths[index.to(layout.lengths.device)], tokens)
        return replace(
            self,
            memory=self.memory.index_select(0, index),
            mask=self.mask.index_select(0, index),
            init_state=self.init_state.index_select(0, index),
            layout=layout,
        )


@runtime_checkable
class Encoder(Protocol):
    """Anything that turns a batch of source inputs into an :class:`EncoderOutput`."""

    output_size: int  # D of ``memory``
    init_size: int  # size of ``init_state``

    def __call__(self, source) -> EncoderOutput: ...
