"""Text encoder: embeddings + (bi)directional GRU/LSTM over packed sequences.

Legend: B batch, S source length, E embedding size, H hidden size per
direction, D = 2H (bidirectional) or H memory size.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnkit.config import TextEncoderConfig
from attnkit.data.batching import PaddedTokens
from attnkit.errors import UserError
from attnkit.interfaces import EncoderOutput, Tokens

RNNS = {"gru": nn.GRU, "lstm": nn.LSTM}


class TextEncoder(nn.Module):
    def __init__(self, config: TextEncoderConfig, vocab_size: int, pad_index: int = 0):
        super().__init__()
        if config.rnn not in RNNS:
            raise UserError(f"text_encoder.rnn must be one of {', '.join(RNNS)}, got '{config.rnn}'")
        self.config = config
        directions = 2 if config.bidirectional else 1
        self.output_size = config.hidden_size * directions
        self.init_size = self.output_size
        self.embedding = nn.Embedding(vocab_size, config.embedding_size, padding_idx=pad_index)
        self.dropout = nn.Dropout(config.dropout)
        self.rnn = RNNS[config.rnn](
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
        packed = pack_padded_sequence(embedded, lengths.cpu(), batch_first=True, enforce_sorted=False)
        outputs, final = self.rnn(packed)
        memory, _ = pad_packed_sequence(outputs, batch_first=True, total_length=ids.shape[1])  # (B, S, D)
        if isinstance(final, tuple):  # LSTM: (h, c); the summary uses h
            final = final[0]
        directions = 2 if self.config.bidirectional else 1
        summary = torch.cat(list(final[-directions:]), dim=-1)  # top layer, last forward (+ first backward) state: (B, D)
        mask = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0) < lengths.unsqueeze(1)  # (B, S)
        return EncoderOutput(memory=memory, mask=mask, init_state=summary, layout=Tokens(lengths))
