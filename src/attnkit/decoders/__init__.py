"""The decoder families behind one contract (:class:`attnkit.interfaces.Decoder`): search, the trainer,
the losses and the analysis never ask which one they drive.

Adding a family is its module here and one entry in ``FAMILIES`` (the choices of ``decoder.family``).
"""

from __future__ import annotations

from attnkit.config import DecoderConfig
from attnkit.decoders.rnn import RNNDecoder
from attnkit.decoders.transformer import TransformerDecoder
from attnkit.interfaces import Decoder

FAMILIES = {"rnn": RNNDecoder, "transformer": TransformerDecoder}


def build_decoder(config: DecoderConfig, vocab_size: int, memory_size: int, init_size: int, pad_index: int = 0) -> Decoder:
    """The decoder ``config.family`` names, reading memories of ``memory_size`` (and, where it uses one, an
    initial summary of ``init_size``)."""
    return FAMILIES[config.family](config, vocab_size, memory_size, init_size, pad_index)
