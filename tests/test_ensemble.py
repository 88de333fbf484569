"""Ensemble decoding: one model twice decodes as the model alone; two models' step is the mean of their log-probs."""

import pytest
import torch

from attnkit.data.batching import pad_sequences
from attnkit.ensemble import EnsembleDecoder
from attnkit.search import beam_search, greedy_search
from attnkit.vocab import Vocabulary
from conftest import TINY_TRANSFORMER, tiny_model

BOS, EOS = Vocabulary.bos_index, Vocabulary.eos_index
SOURCES = [[4, 5, 6, 7, 8], [9, 10], [5, 5, 6], [10, 9, 8, 7]]


def likely_to_end(vocab, seed=0, **settings):
    model = tiny_model(vocab, seed=seed, **settings)
    with torch.no_grad():
        model.decoder.output.bias[EOS] += 1.5  # hypotheses end at different lengths
    return model


@pytest.mark.parametrize("settings", [dict(style="luong"), dict(style="bahdanau", rnn="lstm"), TINY_TRANSFORMER])
def test_one_model_twice_decodes_as_the_model_alone(vocab, settings):
    model = likely_to_end(vocab, **settings)
    encoded = model.encode(pad_sequences(SOURCES))
    twice = EnsembleDecoder([(model.decoder, encoded), (model.decoder, model.encode(pad_sequences(SOURCES)))])
    alone = beam_search(model.decoder, encoded, BOS, EOS, beam_size=3, max_length=10, n_best=2)
    together = beam_search(twice, twice.encoded, BOS, EOS, beam_size=3, max_length=10, n_best=2)
    for one, other in zip(alone, together):
        assert [h.tokens for h in one] == [h.tokens for h in other]
        assert [h.log_prob for h in one] == pytest.approx([h.log_prob for h in other], abs=1e-5)
        for a, b in zip(one, other):
            torch.testing.assert_close(a.attention, b.attention)
    greedy = greedy_search(twice, twice.encoded, BOS, EOS, max_length=10)
    assert [h.tokens for h in greedy] == [h.tokens for h in greedy_search(model.decoder, encoded, BOS, EOS, max_length=10)]


def test_two_models_step_on_the_mean_of_their_log_probabilities_with_the_first_one_s_attention(vocab):
    first, second = likely_to_end(vocab, seed=0), likely_to_end(vocab, seed=1, **TINY_TRANSFORMER)  # any two decoders
    sources = pad_sequences(SOURCES)
    ensemble = EnsembleDecoder([(first.decoder, first.encode(sources)), (second.decoder, second.encode(sources))])
    state = ensemble.init_state(ensemble.encoded).expand_beams(2)
    previous = torch.full((len(SOURCES) * 2,), BOS)
    out = ensemble.step(previous, state)
    one = first.decoder.step(previous, first.decoder.init_state(ensemble.members_encoded[0]).expand_beams(2))
    two = second.decoder.step(previous, second.decoder.init_state(ensemble.members_encoded[1]).expand_beams(2))
    expected = (torch.log_softmax(one.logits, -1) + torch.log_softmax(two.logits, -1)) / 2  # (B*K, V)
    torch.testing.assert_close(out.logits, expected)
    torch.testing.assert_close(out.attention, one.attention)
    rows, sources_kept = torch.tensor([2, 3, 6, 7]), torch.tensor([1, 3])  # the beams of sentences 1 and 3
    kept = out.state.select_beams(rows, sources_kept)
    assert kept.beams == 2 and all(member.mask.shape[0] == 2 for member in kept.members)


def test_an_ensemble_refuses_sources_it_did_not_encode(vocab):
    model = tiny_model(vocab)
    ensemble = EnsembleDecoder([(model.decoder, model.encode(pad_sequences(SOURCES)))])
    with pytest.raises(ValueError, match="pass ensemble.encoded"):
        beam_search(ensemble, model.encode(pad_sequences(SOURCES)), BOS, EOS, beam_size=2, max_length=5)
    with pytest.raises(ValueError, match="same sources"):
        EnsembleDecoder([(model.decoder, model.encode(pad_sequences(SOURCES))), (model.decoder, model.encode(pad_sequences(SOURCES[:2])))])
