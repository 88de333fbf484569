"""Text encoder: embeddings + (bi)directional GRU/LSTM over packed sequences, or no RNN at all.

With ``rnn: none`` each memory vector is its word's embedding plus a sinusoidal
code of its position: a position holds its own word only, so whatever the decoder
needs of a word it must read by attending to that word (attention that is faithful
by construction; a bidirectional RNN spreads every word over all positions).

Legend: B batch, S source length, E embedding size, H hidden size per
direction, D = 2H (bidirectional), H, or E (no RNN) memory size.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnkit.blocks import sinusoidal_positions
from attnkit.cells import CELLS
from attnkit.config import TextEncoderConfig
from attnkit.interfaces import EncoderOutput, PaddedTokens, Tokens

NO_RNN = "none"  # memory = embedding + position code: each position holds only its word
RNNS = (*CELLS, NO_RNN)  # the choices of text_encoder.rnn


class TextEncoder(nn.Module):
    def __init__(self, config: TextEncoderConfig, vocab_size: int, pad_index: int = 0):
        super().__init__()
        self.config = config
        directions = 2 if config.bidirectional else 1
        self.output_size = config.embedding_size if config.rnn == NO_RNN else config.hidden_size * directions
        self.init_size = self.output_size
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
        mask = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0) < lengths.unsqueeze(1)  # (B, S)
        if self.rnn is None:
            real = mask.unsqueeze(-1).to(embedded.dtype)  # (B, S, 1)
            memory = (embedded + sinusoidal_positions(ids.shape[1], embedded.shape[-1], ids.device)) * real  # (B, S, E), padding at zero
            summary = (memory * real).sum(1) / real.sum(1).clamp(min=1)  # (B, E) mean over the real words
            return EncoderOutput(memory=memory, mask=mask, init_state=summary, layout=Tokens(lengths))
        packed = pack_padded_sequence(embedded, lengths.cpu(), batch_first=True, enforce_sorted=False)
        outputs, final = self.rnn(packed)
        memory, _ = pad_packed_sequence(outputs, batch_first=True, total_length=ids.shape[1])  # (B, S, D)
        if isinstance(final, tuple):  # LSTM: (h, c); the summary uses h
            final = final[0]
        directions = 2 if self.config.bidirectional else 1
        summary = torch.cat(list(final[-directions:]), dim=-1)  # top layer, last forward (+ first backward) state: (B, D)
        return EncoderOutput(memory=memory, mask=mask, init_state=summary, layout=Tokens(lengths))
