"""Text encoders: embeddings + (bi)directional GRU/LSTM over packed sequences, no RNN at all, or
Transformer self-attention layers (``family: transformer``).

With ``rnn: none`` each memory vector is its word's embedding plus a sinusoidal
code of its position: a position holds its own word only, so whatever the decoder
needs of a word it must read by attending to that word (attention that is faithful
by construction; a bidirectional RNN spreads every word over all positions).

The Transformer encoder (Vaswani et al. 2017) scales the embeddings by sqrt(M), adds sinusoidal or
learned position codes and runs ``num_layers`` pre-norm self-attention layers (:mod:`attnkit.blocks`)
in which padding is never attended to; its memory has the model size M = ``hidden_size``.

Legend: B batch, S source length, E embedding size, H hidden size per
direction, D = 2H (bidirectional), H, E (no RNN) or M (Transformer) memory size.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from attnkit.blocks import ScaledEmbedding, SelfAttentionStack, sinusoidal_positions
from attnkit.cells import CELLS
from attnkit.config import TextEncoderConfig
from attnkit.interfaces import EncoderOutput, PaddedTokens, Tokens
from attnkit.precision import to_fp32, without_autocast

NO_RNN = "none"  # memory = embedding + position code: each position holds only its word
RNNS = (*CELLS, NO_RNN)  # the choices of text_encoder.rnn
POSITIONS = ("sinusoidal", "learned")  # the choices of text_encoder.positions (transformer)


def build_text_encoder(config: TextEncoderConfig, vocab_size: int, pad_index: int = 0) -> nn.Module:
    """The text encoder of ``config.family`` (:data:`FAMILIES`)."""
    return FAMILIES[config.family](config, vocab_size, pad_index)


def _real_positions(ids: Tensor, lengths: Tensor) -> Tensor:
    return torch.arange(ids.shape[1], device=ids.device).unsqueeze(0) < lengths.unsqueeze(1)  # (B, S) True = real


def _mean_of_real(memory: Tensor, mask: Tensor) -> Tensor:
    """The mean memory vector over each row's real positions (B, D): the summary a decoder may start from."""
    real = mask.unsqueeze(-1).to(memory.dtype)  # (B, S, 1)
    return (memory * real).sum(1) / real.sum(1).clamp(min=1)


def pack_from_host_lengths(embedded: Tensor, host_lengths: Tensor) -> PackedSequence:
    """``embedded`` (B, S, E) packed for an RNN, as ``pack_padded_sequence(..., enforce_sorted=False)`` packs it, from
    the lengths' host copy and without waiting for the GPU: that function copies its sort order to the device
    with a blocking copy (a host synchronisation every batch); here the orders travel with non_blocking copies.
    Unpack with :func:`unpack_in_batch_order`, which reads nothing back either."""
    sorted_lengths, order = torch.sort(host_lengths, descending=True)  # on the host
    to_device = lambda indices: indices.to(embedded.device, non_blocking=True)  # noqa: E731
    sorted_indices, unsorted_indices = to_device(order), to_device(torch.argsort(order))
    packed = pack_padded_sequence(embedded.index_select(0, sorted_indices), sorted_lengths, batch_first=True)
    return PackedSequence(packed.data, packed.batch_sizes, sorted_indices, unsorted_indices)  # the RNN and unpacking restore the order


def unpack_in_batch_order(outputs: PackedSequence, total_length: int) -> Tensor:
    """``pad_packed_sequence(outputs, batch_first=True, total_length=...)``'s padded output (B, S, D), without the
    lengths it also returns: torch reorders those with the batch order copied to the host, a blocking read of the
    GPU every batch (the bi-GRU recipe's one host synchronisation per step in the GPU check)."""
    in_sorted_order = PackedSequence(outputs.data, outputs.batch_sizes)  # no indices: padded as sorted
    padded, _ = pad_packed_sequence(in_sorted_order, batch_first=True, total_length=total_length)  # (B, S, D), longest first
    return padded.index_select(0, outputs.unsorted_indices)  # (B, S, D) in the batch's order


class TransformerTextEncoder(nn.Module):
    """The ``transformer`` text encoder family (module docstring)."""

    def __init__(self, config: TextEncoderConfig, vocab_size: int, pad_index: int = 0):
        super().__init__()
        self.config = config
        size = config.hidden_size
        self.output_size = self.init_size = size
        self.max_length = config.max_positions if config.positions == "learned" else None  # the longest source it can read (None: any)
        self.embedding = ScaledEmbedding(vocab_size, size, pad_index)
        self.learned_positions = nn.Embedding(config.max_positions, size) if config.positions == "learned" else None
        self.dropout = nn.Dropout(config.dropout)
        self.layers = SelfAttentionStack(size, config.heads, config.feedforward_size, config.num_layers, config.dropout)

    def forward(self, source: PaddedTokens) -> EncoderOutput:
        inputs, mask = self._inputs(source)  # (B, S, M), (B, S)
        memory = self.layers(inputs, mask)  # (B, S, M)
        memory = memory * mask.unsqueeze(-1).to(memory.dtype)  # padding at zero, as the RNN encoders leave it
        return EncoderOutput(memory=memory, mask=mask, init_state=_mean_of_real(memory, mask), layout=Tokens(lengths=source.lengths))

    def self_attention(self, source: PaddedTokens) -> list[Tensor]:
        """Each layer's self-attention weights over ``source``: one (B, h, S, S) per layer (rows: the words attending)."""
        return self.layers.attention_weights(*self._inputs(source))

    def _inputs(self, source: PaddedTokens) -> tuple[Tensor, Tensor]:
        """The scaled embeddings plus position codes (B, S, M), and the real positions (B, S)."""
        ids = source.ids
        embedded = self.embedding(ids)  # (B, S, M)
        if self.learned_positions is None:
            positions = sinusoidal_positions(ids.shape[1], self.output_size, ids.device).to(embedded.dtype)
        else:
            # (S, M): the config keeps every real word within the table; padding past it (a batch padded to a multiple
            # of 8 on CUDA) reads the last code, and padding is masked
            positions = self.learned_positions(torch.arange(ids.shape[1], device=ids.device).clamp(max=self.max_length - 1))
        return self.dropout(embedded + positions), _real_positions(ids, source.lengths)


class TextEncoder(nn.Module):
    """The ``rnn`` text encoder family: a (bi)directional GRU/LSTM, or no RNN (``rnn: none``)."""

    def __init__(self, config: TextEncoderConfig, vocab_size: int, pad_index: int = 0):
        super().__init__()
        self.config = config
        directions = 2 if config.bidirectional else 1
        self.output_size = config.embedding_size if config.rnn == NO_RNN else config.hidden_size * directions
        self.init_size = self.output_size
        self.max_length = None  # reads a source of any length
        self.embedding = nn.Embedding(vocab_size, config.embedding_size, padding_idx=pad_index)
        self.dropout = nn.Dropout(config.dropout)
        if config.rnn == NO_RNN:
            self.rnn = None
            return
        self.rnn = CELLS[config.rnn](
            config.embedding_size,
            config.hidden_size,
            num_layers=config.num_layers,
            batch_first=True,
            bidirectional=config.bidirectional,
            dropout=config.dropout if config.num_layers > 1 else 0.0,
        )

    def forward(self, source: PaddedTokens) -> EncoderOutput:
        ids, lengths = source.ids, source.lengths
        embedded = self.dropout(self.embedding(ids))  # (B, S, E)
        mask = _real_positions(ids, lengths)  # (B, S)
        if self.rnn is None:
            real = mask.unsqueeze(-1).to(embedded.dtype)  # (B, S, 1)
            memory = (embedded + sinusoidal_positions(ids.shape[1], embedded.shape[-1], ids.device)) * real  # (B, S, E), padding at zero
            return EncoderOutput(memory=memory, mask=mask, init_state=_mean_of_real(memory, mask), layout=Tokens(lengths))
        packed = pack_from_host_lengths(to_fp32(embedded), source.host_lengths)
        with without_autocast():  # recurrent layers run in fp32 (attnkit.precision)
            outputs, final = self.rnn(packed)
        memory = unpack_in_batch_order(outputs, total_length=ids.shape[1])  # (B, S, D)
        if isinstance(final, tuple):  # LSTM: (h, c); the summary uses h
            final = final[0]
        directions = 2 if self.config.bidirectional else 1
        summary = torch.cat(list(final[-directions:]), dim=-1)  # top layer, last forward (+ first backward) state: (B, D)
        return EncoderOutput(memory=memory, mask=mask, init_state=summary, layout=Tokens(lengths))


# Every text encoder family by its config name (text_encoder.family), as decoders.FAMILIES has the decoders': a new
# family is its class above and one entry here.
FAMILIES: dict[str, type[nn.Module]] = {"rnn": TextEncoder, "transformer": TransformerTextEncoder}
