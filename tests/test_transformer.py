"""The Transformer family: multi-head attention, the decoder's cache, its masks and its declared attention."""

import pytest
import torch

from attnkit.attention import MultiHeadAttention
from attnkit.config import load_config
from attnkit.data.batching import pad_sequences
from attnkit.errors import UserError
from attnkit.decoders.transformer import RecomputingDecoder
from attnkit.search import beam_search
from attnkit.vocab import Vocabulary
from conftest import TINY_TRANSFORMER, tiny_model

BOS, EOS = Vocabulary.bos_index, Vocabulary.eos_index
SOURCES = pad_sequences([[4, 5, 6, 7], [8, 9], [10, 4, 5]])  # padding in the memory
TARGETS = pad_sequences([[2, 5, 6, 7, 3], [2, 8, 3], [2, 9, 9, 3]]).ids  # and in the target


def _model(vocab, seed=0, **settings):
    return tiny_model(vocab, seed=seed, **{**TINY_TRANSFORMER, **settings})


def _step_loop(decoder, encoded, inputs):
    state, logits, attention = decoder.init_state(encoded), [], []
    for t in range(inputs.shape[1]):
        out = decoder.step(inputs[:, t], state)
        state = out.state
        logits.append(out.logits)
        attention.append(out.attention)
    return torch.stack(logits, 1), torch.stack(attention, 1)  # (B, T, V), (B, T, L)


@pytest.mark.parametrize("settings", [dict(num_layers=1), dict(), dict(attention_layer=0, attention_head=1), dict(tie_embeddings=True)])
def test_teacher_forced_forward_equals_the_cached_step_loop(vocab, settings):
    model = _model(vocab, **settings)
    encoded = model.encode(SOURCES)
    inputs = TARGETS[:, :-1]
    output = model.decoder(encoded, inputs)
    logits, attention = _step_loop(model.decoder, encoded, inputs)
    real = inputs != Vocabulary.pad_index  # a padded step's output is never read
    torch.testing.assert_close(output.logits[real], logits[real])
    torch.testing.assert_close(output.attention[real], attention[real])


def test_the_causal_mask_hides_the_future(vocab):
    model = _model(vocab)
    encoded = model.encode(SOURCES)
    one, other = TARGETS[:, :-1].clone(), TARGETS[:, :-1].clone()
    other[:, 2] = 10  # change word 2 of every row
    a, b = model.decoder(encoded, one), model.decoder(encoded, other)
    torch.testing.assert_close(a.logits[:, :2], b.logits[:, :2])  # steps 0 and 1 have not seen it
    torch.testing.assert_close(a.heads[..., :2, :], b.heads[..., :2, :])
    assert not torch.allclose(a.logits[:, 2], b.logits[:, 2])


def test_every_head_gives_padding_zero_weight_and_sums_to_one(vocab):
    model = _model(vocab, heads=4)
    output = model.decoder(model.encode(SOURCES), TARGETS[:, :-1])
    heads = output.heads  # (B, N, h, T, L)
    assert heads.shape == (3, 2, 4, TARGETS.shape[1] - 1, 4)
    assert (heads[1, ..., 2:] == 0).all() and (heads[2, ..., 3:] == 0).all()
    torch.testing.assert_close(heads.sum(-1), torch.ones(heads.shape[:-1]))
    torch.testing.assert_close(output.attention, heads[:, -1].mean(1))  # the default aggregate: the last layer's mean


def test_no_attention_asked_no_weights_made_and_the_same_logits(vocab):
    model = _model(vocab)
    encoded = model.encode(SOURCES)
    fused = model.decoder(encoded, TARGETS[:, :-1], need_attention=False)
    explicit = model.decoder(encoded, TARGETS[:, :-1])
    assert fused.attention is None and fused.heads is None
    torch.testing.assert_close(fused.logits, explicit.logits)


@pytest.mark.parametrize("need_weights", [False, True])
def test_the_beams_of_a_source_attend_over_one_copy_as_over_their_own(need_weights):
    torch.manual_seed(0)
    attention = MultiHeadAttention(8, 2, memory_size=6).eval()
    memory, mask = torch.randn(2, 5, 6), torch.tensor([[True] * 5, [True, True, True, False, False]])
    queries = torch.randn(2 * 3, 2, 8)  # 3 beams per source, 2 steps each
    keys, values = attention.keys_values(memory)
    shared, shared_weights = attention(queries, keys, values, mask.unsqueeze(1), beams=3, need_weights=need_weights)
    own_keys, own_values = (x.repeat_interleave(3, 0) for x in (keys, values))
    own, own_weights = attention(queries, own_keys, own_values, mask.repeat_interleave(3, 0).unsqueeze(1), beams=1, need_weights=need_weights)
    torch.testing.assert_close(shared, own)
    if need_weights:
        torch.testing.assert_close(shared_weights, own_weights)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_beam_search_with_the_cache_equals_recomputing_the_prefix(vocab, beam_size):
    model = _model(vocab, seed=3)
    with torch.no_grad():
        model.decoder.output.bias[EOS] += 1.0  # hypotheses end at different lengths
    encoded = model.encode(SOURCES)
    cached = beam_search(model.decoder, encoded, BOS, EOS, beam_size, max_length=9, n_best=beam_size)
    recomputed = beam_search(RecomputingDecoder(model.decoder), encoded, BOS, EOS, beam_size, max_length=9, n_best=beam_size)
    for mine, theirs in zip(cached, recomputed):
        assert [h.tokens for h in mine] == [h.tokens for h in theirs]
        for a, b in zip(mine, theirs):
            assert a.score == pytest.approx(b.score, abs=1e-5)
            torch.testing.assert_close(a.attention, b.attention)


@pytest.mark.parametrize(
    "settings, key",
    [
        (dict(heads=3), "decoder.heads"),
        (dict(embedding_size=6), "decoder.embedding_size"),
        (dict(attention_layer=2), "decoder.attention_layer"),
        (dict(attention_head=2), "decoder.attention_head"),
        (dict(style="bahdanau"), "decoder.style"),
        (dict(input_feeding=True), "decoder.input_feeding"),
        (dict(style="bahdanau", context_gate=True), "decoder.style"),
        (dict(score="additive"), "decoder.score"),
    ],
)
def test_a_setting_a_transformer_cannot_take_is_one_message_naming_its_key(settings, key):
    overrides = [f"decoder.{name}={value}" for name, value in {**TINY_TRANSFORMER, **settings}.items()]
    with pytest.raises(UserError, match=f"config key {key}"):
        load_config(None, overrides)


def test_scheduled_sampling_is_refused_for_a_transformer():
    overrides = [f"decoder.{name}={value}" for name, value in TINY_TRANSFORMER.items()]
    with pytest.raises(UserError, match="config key train.teacher_forcing"):
        load_config(None, [*overrides, "train.teacher_forcing=0.9"])
