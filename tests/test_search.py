import pytest
import torch

from attnkit.data.batching import pad_sequences
from attnkit.interfaces import StepOutput
from attnkit.interfaces import EncoderOutput, Tokens
from attnkit.search import beam_search, greedy_search, length_penalty, max_steps
from attnkit.vocab import Vocabulary
from conftest import TINY_TRANSFORMER, tiny_model

BOS, EOS = Vocabulary.bos_index, Vocabulary.eos_index
SOURCES = [[4, 5, 6, 7, 8], [9, 10], [5, 5, 6], [10, 9, 8, 7]]
STYLES = [dict(style="luong"), dict(style="luong", input_feeding=True, rnn="lstm"), dict(style="bahdanau", context_gate=True), TINY_TRANSFORMER]


def _trained_like(vocab, seed=0, **settings):
    """A random tiny model whose <eos> is likely enough that hypotheses end at different lengths."""
    model = tiny_model(vocab, seed=seed, **settings)
    with torch.no_grad():
        model.decoder.output.bias[EOS] += 1.5
    return model


@pytest.mark.parametrize("settings", STYLES)
def test_beam_size_one_equals_greedy(vocab, settings):
    model = _trained_like(vocab, **settings)
    encoded = model.encode(pad_sequences(SOURCES))
    greedy = greedy_search(model.decoder, encoded, BOS, EOS, max_length=12)
    beam = beam_search(model.decoder, encoded, BOS, EOS, beam_size=1, max_length=12, alpha=0.0)
    for g, (b,) in zip(greedy, beam):
        assert g.tokens == b.tokens and g.finished == b.finished
        assert g.log_prob == pytest.approx(b.log_prob, abs=1e-5)
        torch.testing.assert_close(g.attention, b.attention)


@pytest.mark.parametrize("settings", STYLES)
@pytest.mark.parametrize("beam_size", [1, 3])
def test_a_padded_batch_decodes_like_each_sentence_alone(vocab, settings, beam_size):
    model = _trained_like(vocab, **settings)
    batch = beam_search(model.decoder, model.encode(pad_sequences(SOURCES)), BOS, EOS, beam_size, max_length=10, n_best=beam_size)
    for source, together in zip(SOURCES, batch):
        alone = beam_search(model.decoder, model.encode(pad_sequences([source])), BOS, EOS, beam_size, max_length=10, n_best=beam_size)[0]
        assert [h.tokens for h in together] == [h.tokens for h in alone]
        for a, b in zip(together, alone):
            assert a.score == pytest.approx(b.score, abs=1e-5)
            assert a.attention.shape == (len(a.tokens) + a.finished, len(source))
            torch.testing.assert_close(a.attention, b.attention, atol=1e-5, rtol=1e-4)


def _force_decode(decoder, encoded, tokens):
    """Teacher-force ``tokens`` (the last may be <eos>) through ``decoder.step`` from <bos>: attention rows (T, L) and summed log-probability."""
    state, previous, rows, log_prob = decoder.init_state(encoded), torch.tensor([BOS]), [], 0.0
    with torch.no_grad():
        for token in tokens:
            out = decoder.step(previous, state)
            rows.append(out.attention[0])
            log_prob += float(torch.log_softmax(out.logits[0].float(), -1)[token])
            state, previous = out.state, torch.tensor([token])
    return torch.stack(rows), log_prob


@pytest.mark.parametrize("settings", STYLES)
@pytest.mark.parametrize("eos_bias", [0.0, 0.3])
def test_every_hypothesis_carries_the_attention_of_force_decoding_its_tokens(vocab, settings, eos_bias):
    # Hypotheses are rebuilt from per-step backpointers; the limits make sentences leave the batch at
    # different steps (the second first), so rows are renumbered under the hypotheses still growing.
    model = tiny_model(vocab, seed=2, **settings)
    with torch.no_grad():
        model.decoder.output.bias[EOS] += eos_bias
    encoded = model.encode(pad_sequences(SOURCES))
    results = beam_search(model.decoder, encoded, BOS, EOS, beam_size=3, max_length=torch.tensor([9, 3, 6, 12]), alpha=0.0, n_best=3)
    for i, (source, hypotheses) in enumerate(zip(SOURCES, results)):
        alone = EncoderOutput(encoded.memory[i : i + 1], encoded.mask[i : i + 1], encoded.init_state[i : i + 1], Tokens(torch.tensor([len(source)])))
        for h in hypotheses:
            attention, log_prob = _force_decode(model.decoder, alone, h.tokens + [EOS] * h.finished)
            torch.testing.assert_close(h.attention, attention[:, encoded.mask[i]], atol=1e-5, rtol=1e-4)
            assert h.log_prob == pytest.approx(log_prob, abs=1e-4)


def test_greedy_batch_equals_one_at_a_time(vocab):
    model = _trained_like(vocab)
    batch = greedy_search(model.decoder, model.encode(pad_sequences(SOURCES)), BOS, EOS, max_length=10)
    for source, together in zip(SOURCES, batch):
        alone = greedy_search(model.decoder, model.encode(pad_sequences([source])), BOS, EOS, max_length=10)[0]
        assert together.tokens == alone.tokens
        torch.testing.assert_close(together.attention, alone.attention, atol=1e-5, rtol=1e-4)


def test_no_hypothesis_ends_gives_the_best_unfinished_one(vocab):
    model = tiny_model(vocab)
    with torch.no_grad():
        model.decoder.output.bias[EOS] = -1e4  # <eos> can never win
    encoded = model.encode(pad_sequences(SOURCES[:2]))
    for hypotheses in beam_search(model.decoder, encoded, BOS, EOS, beam_size=3, max_length=6, n_best=2):
        assert len(hypotheses) == 2
        assert all(not h.finished and len(h.tokens) == 6 and h.attention.shape[0] == 6 for h in hypotheses)
        assert hypotheses[0].score >= hypotheses[1].score
    for hypothesis in greedy_search(model.decoder, encoded, BOS, EOS, max_length=6):
        assert not hypothesis.finished and len(hypothesis.tokens) == 6


def test_per_sentence_length_limits(vocab):
    model = tiny_model(vocab)
    with torch.no_grad():
        model.decoder.output.bias[EOS] = -1e4
    encoded = model.encode(pad_sequences(SOURCES[:2]))
    limits = torch.tensor([3, 5])
    assert [len(h.tokens) for h in greedy_search(model.decoder, encoded, BOS, EOS, limits)] == [3, 5]
    assert [len(h[0].tokens) for h in beam_search(model.decoder, encoded, BOS, EOS, 2, limits)] == [3, 5]


def test_n_best_is_sorted_and_attention_rows_sum_to_one(vocab):
    model = _trained_like(vocab, seed=3)
    results = beam_search(model.decoder, model.encode(pad_sequences(SOURCES)), BOS, EOS, beam_size=4, max_length=8, n_best=3)
    for hypotheses in results:
        scores = [h.score for h in hypotheses]
        assert scores == sorted(scores, reverse=True) and len(hypotheses) == 3
        for h in hypotheses:
            torch.testing.assert_close(h.attention.sum(-1), torch.ones(h.attention.shape[0]))


def test_n_best_puts_the_finished_first_then_those_the_length_limit_stopped(vocab):
    """With fewer finished hypotheses than n_best, unfinished ones fill the list after them, each group best first:
    an unfinished score never paid for <eos>, so it may be higher than a finished one's and still rank after it."""
    higher_unfinished_after_finished = 0
    for seed in range(6):
        model = tiny_model(vocab, seed=seed, **TINY_TRANSFORMER)
        with torch.no_grad():  # a peaked output layer: scores far apart, and some hypotheses end early
            model.decoder.output.weight.mul_(4.0)
            model.decoder.output.bias.mul_(4.0)
        for hypotheses in beam_search(model.decoder, model.encode(pad_sequences(SOURCES)), BOS, EOS, beam_size=4, max_length=4, n_best=4):
            finished = [h.score for h in hypotheses if h.finished]
            unfinished = [h.score for h in hypotheses if not h.finished]
            assert [h.finished for h in hypotheses] == [True] * len(finished) + [False] * len(unfinished)
            assert finished == sorted(finished, reverse=True) and unfinished == sorted(unfinished, reverse=True)
            higher_unfinished_after_finished += bool(finished and unfinished and max(unfinished) > min(finished))
    assert higher_unfinished_after_finished > 0  # the case this test is about was built


def test_the_length_limit_is_the_ratio_times_the_source_rounded_as_written():
    """2.1 x 30 is 62.999... in float32 (and float64): the limit was one step short of the 63 asked for."""
    def limit(ratio: float, words: int, offset: int) -> int:
        mask = torch.ones(1, words, dtype=torch.bool)
        return int(max_steps(EncoderOutput(torch.zeros(1, words, 1), mask, torch.zeros(1, 1), Tokens(torch.tensor([words]))), ratio, offset)[0])

    assert [limit(2.1, 30, 0), limit(1.3, 90, 10), limit(1.05, 60, 0), limit(0.29, 100, 0), limit(2.0, 7, 10), limit(0.5, 3, 0)] == [63, 127, 63, 29, 24, 1]


def test_length_penalty_follows_gnmt():
    assert length_penalty(1, 0.0) == 1.0
    assert length_penalty(7, 1.0) == pytest.approx(2.0)


class _StepCount:
    """A decoder state that only counts the steps each row has taken."""

    def __init__(self, steps):
        self.steps = steps  # (rows,)

    def expand_beams(self, beams):
        return _StepCount(self.steps.repeat_interleave(beams))

    def select_beams(self, rows, sources):
        return _StepCount(self.steps[rows])


class _SureOfFiveWords:
    """An overconfident model: word 4 is near certain for five steps, then <eos>; an early <eos> costs 9 nats, any other word 20."""

    vocab = 6

    def init_state(self, encoded):
        return _StepCount(torch.zeros(encoded.batch_size, dtype=torch.long))

    def step(self, previous, state):
        rows = state.steps.shape[0]
        logits = torch.full((rows, self.vocab), -20.0)
        five = state.steps >= 5  # (rows,)
        logits[:, 4] = torch.where(five, -9.0, 0.0)
        logits[:, EOS] = torch.where(five, 0.0, -9.0)
        return StepOutput(logits, torch.full((rows, 2), 0.5), _StepCount(state.steps + 1))


@pytest.mark.parametrize("n_best", [1, 3])
def test_early_unlikely_endings_do_not_stop_the_search_before_the_best_hypothesis_ends(n_best):
    # Each early <eos> ranks second behind the near-certain word, so the beam holds 3 finished
    # (bad) hypotheses after 3 steps; stopping there would return a score of about -9.
    encoded = EncoderOutput(torch.zeros(1, 2, 4), torch.ones(1, 2, dtype=torch.bool), torch.zeros(1, 4), Tokens(torch.tensor([2])))
    (hypotheses,) = beam_search(_SureOfFiveWords(), encoded, BOS, EOS, beam_size=3, max_length=20, alpha=0.0, n_best=n_best)
    assert hypotheses[0].tokens == [4] * 5 and hypotheses[0].finished
    assert hypotheses[0].log_prob > -0.01
    assert [h.score for h in hypotheses] == sorted((h.score for h in hypotheses), reverse=True)


class _SureOfNineWordsAfterADoubt:
    """Overconfident at a length penalty: at the first step <eos> (-0.47 nats) beats word 4 (-0.97), which is then near
    certain for eight more steps before <eos> is; a mid-sentence <eos> costs 9 nats, any other word 20."""

    vocab = 6

    def init_state(self, encoded):
        return _StepCount(torch.zeros(encoded.batch_size, dtype=torch.long))

    def step(self, previous, state):
        rows = state.steps.shape[0]
        logits = torch.full((rows, self.vocab), -20.0)
        first, nine = state.steps == 0, state.steps >= 9  # (rows,)
        logits[:, 4] = torch.where(first, -0.5, torch.where(nine, -9.0, 0.0))
        logits[:, EOS] = torch.where(first | nine, 0.0, -9.0)
        return StepOutput(logits, torch.full((rows, 2), 0.5), _StepCount(state.steps + 1))


def test_a_length_penalty_does_not_stop_the_search_while_a_live_hypothesis_can_still_win():
    # At alpha 1 ending at once scores -0.47, and the live [4] scores -0.97 at its length, so stopping on the
    # live score as it stands ends the search there; but [4] * 9 + <eos> scores -0.97 / length_penalty(10) = -0.39.
    encoded = EncoderOutput(torch.zeros(1, 2, 4), torch.ones(1, 2, dtype=torch.bool), torch.zeros(1, 4), Tokens(torch.tensor([2])))
    stub = _SureOfNineWordsAfterADoubt()
    ((best,),) = beam_search(stub, encoded, BOS, EOS, beam_size=2, max_length=20, alpha=1.0)
    # Exhaustive over 4 ... 4 <eos>: any other word costs 20 nats, below -20 / length_penalty(20) = -4.8 whatever follows.
    exhaustive = max(_force_decode(stub, encoded, [4] * m + [EOS])[1] / length_penalty(m + 1, 1.0) for m in range(20))
    assert best.tokens == [4] * 9 and best.finished
    assert best.score == pytest.approx(exhaustive)


@pytest.mark.parametrize("beam", [1, 3])
def test_never_keeps_pad_and_bos_out_of_every_output_so_each_attention_row_has_its_word(vocab, beam):
    """An untrained model may rank <pad> first; a word the vocabulary drops would leave its attention row without a label."""
    from attnkit.config import SearchConfig
    from attnkit.search import search

    model = tiny_model(vocab)
    with torch.no_grad():
        model.decoder.output.bias[Vocabulary.pad_index] += 100.0  # <pad> first at every step
    encoded = model.encode(pad_sequences(SOURCES))
    found = search(model.decoder, encoded, BOS, EOS, SearchConfig(beam_size=beam, max_length_offset=6), never=Vocabulary.never_output)
    for best, *_ in found:
        assert not {Vocabulary.pad_index, BOS} & set(best.tokens)
        assert best.attention.shape[0] == len(vocab.decode(best.tokens)) + best.finished


@pytest.mark.parametrize("settings", [STYLES[0], STYLES[2], TINY_TRANSFORMER])
def test_a_sample_s_log_probability_is_the_teacher_forced_one_and_carries_gradients(vocab, settings):
    """What self-critical training needs: each sample's summed log-probs equal log p(sample) as the teacher-forced
    pass computes it, gradients reach the weights, the seed repeats the samples, and <pad> / <bos> are never drawn."""
    from attnkit.search import sample

    model = _trained_like(vocab, **settings)
    encoded = model.encode(pad_sequences(SOURCES))
    draw = lambda: sample(model.decoder, encoded, BOS, EOS, vocab.pad_index, 9, per_source=3, never=[BOS], generator=torch.Generator().manual_seed(0))  # noqa: E731
    drawn = draw()
    assert drawn.tokens.shape[0] == len(SOURCES) * 3 and torch.equal(drawn.tokens, draw().tokens)
    assert not ((drawn.tokens == BOS).any() or (drawn.tokens[:, 0] == vocab.pad_index).any())
    ended = drawn.tokens.gather(1, (drawn.lengths - 1).unsqueeze(1)).squeeze(1) == EOS
    assert ended.any()
    words = drawn.words(EOS)
    assert all(len(w) == int(n) - int(e) for w, n, e in zip(words, drawn.lengths, ended))

    repeated = EncoderOutput.joined([encoded.row(i) for i in range(len(SOURCES)) for _ in range(3)])  # each source's rows, as sampled
    inputs = torch.cat([torch.full((drawn.tokens.shape[0], 1), BOS), drawn.tokens[:, :-1]], 1)  # (B*S, T)
    inputs = inputs.masked_fill(inputs == EOS, vocab.pad_index)
    logits = model.decoder(repeated, inputs).logits  # (B*S, T, V)
    forced = torch.log_softmax(logits.float().index_fill(-1, torch.tensor([vocab.pad_index, BOS]), float("-inf")), -1)
    forced = forced.gather(-1, drawn.tokens.unsqueeze(-1)).squeeze(-1).masked_fill(drawn.tokens == vocab.pad_index, 0.0)  # (B*S, T)
    torch.testing.assert_close(drawn.log_probs.sum(1), forced.sum(1), rtol=1e-4, atol=1e-4)
    drawn.log_probs.sum().backward()
    assert model.decoder.output.weight.grad is not None and model.decoder.output.weight.grad.abs().sum() > 0
