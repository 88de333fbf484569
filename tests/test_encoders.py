"""One contract test for every encoder: what the decoder relies on."""

import pytest
import torch

from attnkit.config import TextEncoderConfig
from attnkit.data.batching import pad_sequences
from attnkit.encoders.text import TextEncoder
from attnkit.interfaces import Encoder, EncoderOutput, Tokens

SOURCES = [[4, 5, 6, 7], [8, 9], [5, 6, 7]]


def text_encoder(rnn="gru", bidirectional=True, layers=1):
    torch.manual_seed(0)
    config = TextEncoderConfig(embedding_size=6, hidden_size=5, num_layers=layers, rnn=rnn, bidirectional=bidirectional, dropout=0.0)
    return TextEncoder(config, vocab_size=12).eval(), pad_sequences(SOURCES)


ENCODERS = {
    "text-bigru": lambda: text_encoder(),
    "text-bilstm-2layers": lambda: text_encoder("lstm", layers=2),
    "text-gru-unidirectional": lambda: text_encoder(bidirectional=False),
}


@pytest.mark.parametrize("name", ENCODERS)
def test_encoder_contract(name):
    encoder, source = ENCODERS[name]()
    assert isinstance(encoder, Encoder)
    out = encoder(source)
    assert isinstance(out, EncoderOutput)
    batch, length, size = out.memory.shape
    assert batch == len(SOURCES) and size == encoder.output_size
    assert out.mask.dtype == torch.bool and out.mask.shape == (batch, length)
    assert out.mask.any(1).all(), "every row needs a real position to attend to"
    assert out.init_state.shape == (batch, encoder.init_size)
    assert torch.isfinite(out.memory).all() and torch.isfinite(out.init_state).all()
    if isinstance(out.layout, Tokens):
        assert out.layout.lengths.tolist() == out.mask.sum(1).tolist()
        assert (out.memory[~out.mask] == 0).all()  # packed RNN leaves padding at zero


@pytest.mark.parametrize("name", ENCODERS)
def test_padding_does_not_change_the_encoding(name):
    encoder, source = ENCODERS[name]()
    together = encoder(source)
    for row, ids in enumerate(SOURCES):
        alone = encoder(pad_sequences([ids]))
        torch.testing.assert_close(together.memory[row, : len(ids)], alone.memory[0], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(together.init_state[row], alone.init_state[0], atol=1e-6, rtol=1e-5)


def test_select_keeps_layout_rows_in_step():
    encoder, source = ENCODERS["text-bigru"]()
    out = encoder(source)
    picked = out.select(torch.tensor([2, 2, 0]))
    assert picked.layout.lengths.tolist() == [3, 3, 4]
    torch.testing.assert_close(picked.memory[0], out.memory[2])
