import itertools

import pytest
import torch

from attnkit.attention import SCORES
from attnkit.data.batching import Batch, pad_sequences
from attnkit.errors import UserError
from attnkit.decoders.rnn import RNNDecoder
from attnkit.vocab import Vocabulary
from conftest import tiny_config, tiny_model

STYLES = [
    dict(style="luong"),
    dict(style="luong", input_feeding=True),
    dict(style="bahdanau"),
    dict(style="bahdanau", context_gate=True),
]


def _batch():
    source = pad_sequences([[4, 5, 6, 7], [8, 9], [10, 4, 5]])
    targets = pad_sequences([[2, 5, 6, 7, 3], [2, 8, 3], [2, 9, 9, 3]]).ids
    return source, targets


def _step_loop(decoder, encoded, inputs):
    state = decoder.init_state(encoded)
    logits, attention = [], []
    for t in range(inputs.shape[1]):
        out = decoder.step(inputs[:, t], state)
        state = out.state
        logits.append(out.logits)
        attention.append(out.attention)
    return torch.stack(logits, 1), torch.stack(attention, 1)


@pytest.mark.parametrize("style, rnn, layers, score", list(itertools.product(range(len(STYLES)), ["gru", "lstm"], [1, 2], ["general", "additive"])))
def test_teacher_forced_forward_equals_the_step_loop(vocab, style, rnn, layers, score):
    model = tiny_model(vocab, rnn=rnn, num_layers=layers, score=score, **STYLES[style])
    source, targets = _batch()
    encoded = model.encode(source)
    output = model.decoder(encoded, targets[:, :-1])
    logits, attention = _step_loop(model.decoder, encoded, targets[:, :-1])
    torch.testing.assert_close(output.logits, logits)
    torch.testing.assert_close(output.attention, attention)


def test_luong_without_input_feeding_takes_the_parallel_path(vocab):
    assert tiny_model(vocab, style="luong").decoder.unrolls_in_parallel
    assert not tiny_model(vocab, style="luong", input_feeding=True).decoder.unrolls_in_parallel
    assert not tiny_model(vocab, style="bahdanau").decoder.unrolls_in_parallel


@pytest.mark.parametrize("score", SCORES)
def test_every_score_drives_the_decoder(vocab, score):
    size = 10  # dot scores need the memory size (2 x 5, bidirectional) to equal the hidden size
    model = tiny_model(vocab, score=score, hidden_size=size)
    source, targets = _batch()
    output = model(Batch(source, targets, torch.arange(3)))
    assert output.logits.shape == (3, targets.shape[1] - 1, len(vocab))
    torch.testing.assert_close(output.attention.sum(-1), torch.ones(3, targets.shape[1] - 1))
    assert (output.attention[1, :, 2:] == 0).all()


def test_teacher_forcing_zero_feeds_the_models_own_predictions(vocab):
    model = tiny_model(vocab, style="bahdanau")
    source, targets = _batch()
    encoded = model.encode(source)
    free = model.decoder(encoded, targets[:, :-1], teacher_forcing=0.0)
    # Re-run teacher-forced on the model's own argmax sequence: identical logits.
    own = torch.cat([targets[:, :1], free.logits.argmax(-1)[:, :-1]], 1)
    forced = model.decoder(encoded, own)
    torch.testing.assert_close(free.logits, forced.logits)


def test_tied_embeddings_share_one_matrix(vocab):
    model = tiny_model(vocab, tie_embeddings=True)
    assert model.decoder.output.weight is model.decoder.embedding.weight
    assert model.decoder.readout_size == model.decoder.config.embedding_size


def test_lstm_bridge_initialises_hidden_and_cell(vocab):
    model = tiny_model(vocab, rnn="lstm", num_layers=2)
    state = model.decoder.init_state(model.encode(_batch()[0]))
    assert state.hidden.shape == state.cell.shape == (2, 3, 10)
    zeros = tiny_model(vocab, rnn="lstm", init="zeros").decoder.init_state(model.encode(_batch()[0]))
    assert zeros.hidden.abs().sum() == 0 and zeros.cell.abs().sum() == 0


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(style="bahdanau", input_feeding=True), "luong style only"),
        (dict(style="luong", context_gate=True), "bahdanau style only"),
        (dict(rnn="rnn"), "decoder.rnn"),
        (dict(style="attend-first"), "decoder.style"),
        (dict(init="random"), "decoder.init"),
    ],
)
def test_inconsistent_decoder_settings_are_user_errors(settings, message):
    with pytest.raises(UserError, match=message):
        RNNDecoder(tiny_config(**settings).decoder, vocab_size=11, memory_size=10, init_size=10)


def test_objective_equals_torch_cross_entropy_and_counts_only_real_tokens(vocab):
    import torch.nn.functional as F

    from attnkit.losses import Seq2SeqObjective

    model = tiny_model(vocab)
    source, targets = _batch()
    batch = Batch(source, targets, torch.arange(3))
    out = Seq2SeqObjective()(model, batch)
    logits, gold = model(batch).logits.flatten(0, 1), targets[:, 1:].flatten()
    assert torch.allclose(out.loss(), F.cross_entropy(logits, gold, ignore_index=0))
    assert torch.allclose(out.nll_sum, F.cross_entropy(logits, gold, ignore_index=0, reduction="sum"))
    assert int(out.tokens) == 4 + 2 + 3


class FixedLogits(torch.nn.Module):
    """A stand-in model whose output logits (B, T, V) are its one parameter."""

    def __init__(self, logits):
        super().__init__()
        self.logits = torch.nn.Parameter(logits)

    def forward(self, batch, teacher_forcing=1.0, need_attention=True):
        from attnkit.interfaces import DecoderOutput

        B, T, _ = self.logits.shape
        return DecoderOutput(self.logits, torch.ones(B, T, 1), torch.ones(B, 1, dtype=torch.bool))


def _smoothed_targets(gold, vocab_size, eps):
    """The smoothed target distribution, written out: 1 - eps on the gold word, eps / (V - 2) on every word but <pad> and <bos>."""
    q = torch.full((len(gold), vocab_size), eps / (vocab_size - 2))
    q[:, [Vocabulary.pad_index, Vocabulary.bos_index]] = 0.0
    q[torch.arange(len(gold)), gold] += 1.0 - eps
    return q


def test_label_smoothing_spreads_its_mass_over_every_word_but_pad_and_bos(vocab):
    import torch.nn.functional as F

    from attnkit.losses import Seq2SeqObjective

    eps = 0.1
    model = tiny_model(vocab)
    source, targets = _batch()
    batch = Batch(source, targets, torch.arange(3))
    out = Seq2SeqObjective(label_smoothing=eps)(model, batch)
    real = targets[:, 1:] != Vocabulary.pad_index
    logits, gold = model(batch).logits[real], targets[:, 1:][real]  # (N, V), (N,)
    V = len(vocab)
    q = _smoothed_targets(gold, V, eps)
    torch.testing.assert_close(q.sum(-1), torch.ones(len(gold)))
    # (1 - eps) * nll + eps * the mean of -log p over the V - 2 words a target can be ...
    log_p = logits.log_softmax(-1)
    allowed = [k for k in range(V) if k not in (Vocabulary.pad_index, Vocabulary.bos_index)]
    by_hand = ((1 - eps) * -log_p[torch.arange(len(gold)), gold] + eps * -log_p[:, allowed].mean(-1)).mean()
    torch.testing.assert_close(out.loss(), by_hand)
    # ... is the cross-entropy against that distribution, and not torch's, which smooths onto <pad> and <bos> too.
    torch.testing.assert_close(out.loss(), F.cross_entropy(logits, q))
    assert not torch.allclose(out.loss(), F.cross_entropy(logits, gold, label_smoothing=eps))
    torch.testing.assert_close(out.nll_sum, F.cross_entropy(logits, gold, reduction="sum"))  # perplexity stays unsmoothed


def test_label_smoothing_never_pushes_pad_or_bos_up():
    from attnkit.losses import Seq2SeqObjective

    torch.manual_seed(0)
    V = 9
    targets = pad_sequences([[2, 5, 6, 7, 3], [2, 8, 3]]).ids  # (2, 5), the second padded
    logits = torch.randn(2, 4, V)
    logits[..., [Vocabulary.pad_index, Vocabulary.bos_index]] -= 8.0  # already unlikely: p < 1/V, where uniform smoothing pushes up
    gradients = {}
    for eps in (0.0, 0.2):
        model = FixedLogits(logits.clone())
        Seq2SeqObjective(label_smoothing=eps)(model, Batch(None, targets, torch.arange(2))).loss().backward()
        gradients[eps] = model.logits.grad
    specials = [Vocabulary.pad_index, Vocabulary.bos_index]
    # d loss / d logit of <pad> or <bos> is p / tokens, as without smoothing: positive, so descent only lowers them.
    torch.testing.assert_close(gradients[0.2][..., specials], gradients[0.0][..., specials])
    real = targets[:, 1:] != Vocabulary.pad_index
    assert (gradients[0.2][..., specials][real] > 0).all()
    assert (gradients[0.2][~real] == 0).all()
    assert not torch.allclose(gradients[0.2], gradients[0.0])  # smoothing does move the other words


def test_a_cell_the_decoder_cannot_step_is_refused_when_it_is_built(monkeypatch):
    """A cell added to cells.CELLS alone trained a Luong decoder's teacher-forced pass, then failed at the first
    step of validation (torch.gru_cell with an nn.RNN's weights)."""
    from torch import nn

    from attnkit import cells
    from attnkit.config import DecoderConfig
    from attnkit.decoders.rnn import RNNDecoder

    monkeypatch.setitem(cells.CELLS, "rnn_tanh", nn.RNN)
    with pytest.raises(ValueError, match="steps gru and lstm cells only"):
        RNNDecoder(DecoderConfig(rnn="rnn_tanh", embedding_size=8, hidden_size=8, attention_size=8), 20, 8, 8)
