"""The encoder contract: what an encoder reads and what it hands to the shared decoder.

Legend: B batch, S source length, L memory length (S tokens or H*W cells),
D memory size, H x W image grid, C backbone channels, g grid side.

Sources (what encoders read) are small frozen dataclasses whose ``kind`` names the
encoder that reads them: :class:`PaddedTokens` for the text encoder, :class:`Pixels`
or :class:`GridFeatures` for the image encoder. A joint model picks its encoder by
that ``kind``, so nothing above the data layer needs to import an encoder to dispatch.

After the encoder nothing branches on modality: the decoder, search, losses and
attention statistics read ``memory``, ``mask`` and ``init_state``; only plots
read ``layout``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol, Union, runtime_checkable

import torch
import torch.nn.functional as F
from torch import Tensor


# -- sources -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PaddedTokens:
    """A batch of token-id sequences, right-padded."""

    kind: ClassVar[str] = "text"
    ids: Tensor  # (B, S)
    lengths: Tensor  # (B,)
    # (B,) the same lengths kept on the CPU wherever ``lengths`` goes: packing a sequence for an RNN needs them
    # there, and reading them back from a GPU would wait for it every batch. Default: ``lengths`` (or its copy).
    host_lengths: Tensor | None = None

    def __post_init__(self) -> None:
        if self.host_lengths is None:
            object.__setattr__(self, "host_lengths", self.lengths.cpu())

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "PaddedTokens":
        return PaddedTokens(self.ids.to(device, non_blocking=non_blocking), self.lengths.to(device, non_blocking=non_blocking), self.host_lengths)

    def pin_memory(self) -> "PaddedTokens":
        return PaddedTokens(self.ids.pin_memory(), self.lengths.pin_memory(), self.host_lengths)

    @property
    def batch_size(self) -> int:
        return self.ids.shape[0]


@dataclass(frozen=True)
class Pixels:
    """Normalised images, ready for the backbone."""

    kind: ClassVar[str] = "image"
    images: Tensor  # (B, 3, H, W)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Pixels":
        return Pixels(self.images.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "Pixels":
        return Pixels(self.images.pin_memory())


@dataclass(frozen=True)
class GridFeatures:
    """The frozen backbone blocks' output, computed earlier (e.g. read from the feature cache): the pooled grid of
    a frozen backbone, or the frozen prefix's map when the last blocks fine-tune (ImageEncoder.cacheable_features)."""

    kind: ClassVar[str] = "image"
    features: Tensor  # (B, C, g, g), or (B, C', H', W') before the fine-tuned blocks; fp16 as cached, fp32 after .to()

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "GridFeatures":
        """Moved as they are (fp16 from the cache: half the bytes to copy), then upcast to fp32 on the device."""
        return GridFeatures(self.features.to(device, non_blocking=non_blocking).float())

    def pin_memory(self) -> "GridFeatures":
        return GridFeatures(self.features.pin_memory())


Source = Union[PaddedTokens, Pixels, GridFeatures]


# -- what the decoder attends over --------------------------------------------------------------------
@dataclass(frozen=True)
class Tokens:
    """Memory positions are source tokens."""

    lengths: Tensor  # (B,) number of real tokens per row


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

    def row(self, i: int) -> "EncoderOutput":
        """Source ``i`` of the batch as a batch of one (the layout is only for plots and is kept whole)."""
        return self.rows(i, i + 1)

    def rows(self, start: int, stop: int) -> "EncoderOutput":
        """Sources ``start`` .. ``stop - 1`` of the batch."""
        layout = Tokens(self.layout.lengths[start:stop]) if isinstance(self.layout, Tokens) else self.layout
        return EncoderOutput(self.memory[start:stop], self.mask[start:stop], self.init_state[start:stop], layout)

    @staticmethod
    def joined(parts: Sequence["EncoderOutput"]) -> "EncoderOutput":
        """Several batches as one, the memories padded to the longest (padding masked out); a grid's layout, or
        every batch's token lengths."""
        length = max(part.memory.shape[1] for part in parts)

        def padded(part: EncoderOutput) -> tuple[Tensor, Tensor]:
            extra = length - part.memory.shape[1]
            return F.pad(part.memory, (0, 0, 0, extra)), F.pad(part.mask, (0, extra), value=False)

        memories, masks = zip(*(padded(part) for part in parts))
        layout = Tokens(torch.cat([part.layout.lengths for part in parts])) if isinstance(parts[0].layout, Tokens) else parts[0].layout
        return EncoderOutput(torch.cat(memories), torch.cat(masks), torch.cat([part.init_state for part in parts]), layout)


@runtime_checkable
class Encoder(Protocol):
    """Anything that turns a batch of source inputs into an :class:`EncoderOutput`."""

    output_size: int  # D of ``memory``
    init_size: int  # size of ``init_state``

    def __call__(self, source) -> EncoderOutput: ...


# -- the decoder contract -------------------------------------------------------------------------------------
# Legend (besides the above): T target steps, V target vocabulary, K beams per source, N layers, h heads.
@runtime_checkable
class DecoderState(Protocol):
    """Everything a decoder carries from one step to the next, for a batch of hypotheses.

    Rows are hypotheses, ``beams`` consecutive rows per source (1 outside beam search). What is computed
    once per source (projected memory, its mask) is kept once per source, so beam search moves only the
    per-row parts when it reorders hypotheses.
    """

    beams: int
    mask: Tensor  # (B, L) the sources' real memory positions; the erasure analysis replaces it to hide some

    def expand_beams(self, beams: int) -> "DecoderState":
        """K copies of every row, for a beam search of width K over each source."""
        ...

    def select_beams(self, rows: Tensor, sources: Tensor) -> "DecoderState":
        """Keep ``sources`` (S',) and, for them, the rows ``rows`` (S'*K,): each group of K new rows must
        come from the matching kept source."""
        ...


@dataclass(frozen=True)
class StepOutput:
    logits: Tensor  # (B*K, V) over the next word
    attention: Tensor  # (B*K, L) the step's attention (a Transformer's: its declared head aggregate)
    state: DecoderState


@dataclass(frozen=True)
class DecoderOutput:
    logits: Tensor  # (B, T, V)
    attention: Tensor | None  # (B, T, L) what losses and analysis read; None when not asked for (need_attention=False)
    mask: Tensor  # (B, L) real memory positions (for attention losses and statistics)
    heads: Tensor | None = None  # (B, N, h, T, L) every layer's and head's cross-attention (multi-head decoders, when asked)


@runtime_checkable
class Decoder(Protocol):
    """What search, the trainer, the losses and the analysis call; every decoder family implements it.

    ``step`` advances every row by one word and is what search and the analysis run; ``forward`` is the
    teacher-forced pass over whole targets (a test proves it equals the step loop for every family).
    """

    reading_offset: int  # steps after the step that emits a word at which the attention query has read it (Shift-Att)

    def init_state(self, encoded: EncoderOutput) -> DecoderState: ...

    def step(self, previous: Tensor, state: DecoderState) -> StepOutput: ...

    def forward(self, encoded: EncoderOutput, inputs: Tensor, teacher_forcing: float = 1.0, need_attention: bool = True) -> DecoderOutput: ...
