"""Importance maps (through attention and from the input) and their agreement with attention: hand-made answers."""

import dataclasses

import pytest
import torch

from attnkit.analysis import agreement, agreement_means, attention_importance, occlusion_importance, rank_correlation, ranks
from attnkit.data.batching import pad_sequences
from attnkit.data.images import occlude_cells
from attnkit.decoders.rnn import RNNState
from attnkit.interfaces import DecoderOutput, EncoderOutput, StepOutput, Tokens
from conftest import TINY_TRANSFORMER, tiny_model

READ = 3  # the one memory position the stub decoder reads


class _ReadsOnlyPosition3:
    """A stub decoder whose next word depends only on memory position 3: word 4 (by 10 nats) when position 3 is
    visible and its memory is not zeroed out, else word 5. Its attention is uniform over the visible positions."""

    def init_state(self, encoded):
        return RNNState(torch.zeros(1, encoded.batch_size, 1), None, None, encoded.memory, encoded.memory, encoded.mask)

    def _logits(self, sees: torch.Tensor, rows: int) -> torch.Tensor:
        logits = torch.zeros(rows, 8)
        logits[:, 4], logits[:, 5] = 10 * sees, 10 * (1 - sees)
        return logits

    def _sees(self, memory, mask) -> torch.Tensor:
        return (mask[:, READ] & (memory[:, READ].abs().sum(-1) > 0)).float()  # (B,)

    def step(self, previous, state):
        attention = state.mask.float() / state.mask.sum(1, keepdim=True)  # (B, L)
        return StepOutput(self._logits(self._sees(state.memory, state.mask), previous.shape[0]), attention, state)

    def __call__(self, encoded, inputs, need_attention=True):
        rows, steps = inputs.shape
        logits = self._logits(self._sees(encoded.memory, encoded.mask), rows).unsqueeze(1).expand(-1, steps, -1)
        return DecoderOutput(logits, None, encoded.mask)


def _source(positions: int = 6, real: int = 5) -> EncoderOutput:
    mask = torch.arange(positions).unsqueeze(0) < real  # (1, L): the last position padding
    return EncoderOutput(torch.ones(1, positions, 3), mask, torch.zeros(1, 3), Tokens(torch.tensor([real])))


def _occluded(source: EncoderOutput) -> EncoderOutput:
    """Version k of the source with real position k's memory zeroed (what greying its input does, for the stub)."""
    real = int(source.mask.sum())
    memory = source.memory.repeat(real, 1, 1)
    memory[torch.arange(real), torch.arange(real)] = 0.0
    return EncoderOutput(memory, source.mask.repeat(real, 1), source.init_state.repeat(real, 1), source.layout)


TARGET = torch.tensor([2, 4, 4, 3])  # <bos> w1 w2 <eos>: 3 forced steps


@pytest.mark.parametrize("form", ["attention", "input"])
def test_a_decoder_that_reads_only_position_3_has_importance_only_there(form):
    source = _source()
    found = attention_importance(_ReadsOnlyPosition3(), source, TARGET) if form == "attention" else occlusion_importance(_ReadsOnlyPosition3(), source, _occluded(source), TARGET)
    assert found.shape == (3, 6)
    assert found[:, 5].isnan().all()  # padding: no importance
    torch.testing.assert_close(found[:2, READ], torch.full((2,), 10.0), atol=1e-3, rtol=0)  # w1, w2 (word 4) need position 3
    others = found[:, [0, 1, 2, 4]]
    torch.testing.assert_close(others, torch.zeros_like(others))


def test_uniform_attention_over_positions_that_do_not_matter_agrees_no_better_than_chance():
    source = _source()
    decoder = _ReadsOnlyPosition3()
    importance = attention_importance(decoder, source, TARGET)[:2]  # (2, 6): the two words
    uniform = torch.full((2, 6), 0.2)
    uniform[:, 5] = 0.0
    found = agreement(uniform, importance, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(found.rank_correlation, torch.zeros(2))
    torch.testing.assert_close(found.peak_match, torch.zeros(2))
    torch.testing.assert_close(found.top_mass, found.shuffled_top_mass)  # a fifth either way
    on_the_read_position = torch.zeros(2, 6)
    on_the_read_position[:, READ] = 1.0
    best = agreement(on_the_read_position, importance, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(best.peak_match, torch.ones(2))
    torch.testing.assert_close(best.top_mass, torch.ones(2))
    assert (best.shuffled_top_mass < 0.5).all() and (best.rank_correlation > 0.4).all()


def test_gains_from_renormalised_attention_do_not_count_against_agreement():
    """A word that rests on position 2 alone: hiding any other position moves its weight onto position 2 and
    raises the word's log-probability, the more the more weight it held. Those gains are not what the word
    rests on; scored raw they would rank every position but the peak against the attention."""
    attention = torch.tensor([[0.12, 0.1, 0.4, 0.09, 0.08, 0.07, 0.06, 0.05, 0.03]])
    importance = -attention / (1 - attention)  # the others' gains: their weight moved onto position 2
    importance[0, 2] = 2.0  # the peak's loss
    found = agreement(attention, importance, generator=torch.Generator().manual_seed(0))
    assert float(found.rank_correlation) > 0.3 and float(found.peak_match) == 1.0
    torch.testing.assert_close(found.top_mass, torch.tensor([0.4]))  # the one position that matters
    wider = agreement(torch.cat([attention, torch.zeros(1, 11)], 1), torch.cat([importance, torch.zeros(1, 11)], 1))
    torch.testing.assert_close(wider.top_mass, torch.tensor([0.4]))  # the top tenth is two positions: only one matters
    assert float(rank_correlation(attention, importance)) < 0  # the raw gains rank against it


def _spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rho written out plainly: Pearson's r of the ranks, tied values sharing their mean rank."""

    def ranked(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=values.__getitem__)
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in order[i : j + 1]:
                out[k] = (i + j) / 2
            i = j + 1
        return out

    rx, ry = ranked(x), ranked(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    covariance = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    return covariance / (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5


def test_rank_correlation_is_spearmans_rho_with_ties():
    generator = torch.Generator().manual_seed(3)
    a, b = torch.randint(0, 4, (5, 9), generator=generator).float(), torch.randn(5, 9, generator=generator)  # a has ties
    expected = torch.tensor([_spearman(x, y) for x, y in zip(a.tolist(), b.tolist())], dtype=torch.float32)
    torch.testing.assert_close(rank_correlation(a, b), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(ranks(torch.tensor([3.0, 1.0, 3.0, 2.0])), torch.tensor([2.5, 0.0, 2.5, 1.0]))
    assert float(rank_correlation(torch.ones(1, 4), torch.arange(4.0).unsqueeze(0))) == 0.0  # a constant row ranks nothing


def test_a_source_of_one_position_has_no_importance_or_agreement():
    source = _source(positions=5, real=1)
    found = attention_importance(_ReadsOnlyPosition3(), source, TARGET)
    assert found.isnan().all()
    summary = agreement_means([agreement(torch.ones(3, 5), found)])
    assert summary["steps"] == 0


@pytest.mark.parametrize("settings", [dict(style="bahdanau", score="additive", rnn="lstm"), TINY_TRANSFORMER], ids=["bahdanau", "transformer"])
def test_importance_through_attention_is_erasure_of_each_position_and_occlusion_reencodes(vocab, settings):
    model = tiny_model(vocab, **settings)
    source_ids = [4, 5, 6, 7]
    encoded = model.encode(pad_sequences([source_ids]))
    target = torch.tensor([2, 5, 9, 6, 3])
    through = attention_importance(model.decoder, encoded, target)  # (4, 4)
    decoder, state = model.decoder, model.decoder.init_state(encoded)
    for t in range(4):  # step t again from the same state without position 2
        out = decoder.step(target[t : t + 1], state)
        without = encoded.mask.clone()
        without[0, 2] = False
        erased = decoder.step(target[t : t + 1], dataclasses.replace(state, mask=without))
        expected = out.logits.log_softmax(-1)[0, target[t + 1]] - erased.logits.log_softmax(-1)[0, target[t + 1]]
        torch.testing.assert_close(through[t, 2], expected, atol=1e-5, rtol=1e-4)
        state = out.state
    # From the input: version k has source word k replaced by <unk>; position 1's column is the whole pass's loss.
    versions = [source_ids[:k] + [vocab.unk_index] + source_ids[k + 1 :] for k in range(4)]
    occluded = model.encode(pad_sequences(versions))
    found = occlusion_importance(model.decoder, encoded, occluded, target)
    with torch.no_grad():
        plain = model.decoder(encoded, target[:-1].unsqueeze(0)).logits.log_softmax(-1)[0]  # (T, V)
        other = model.decoder(occluded.row(1), target[:-1].unsqueeze(0)).logits.log_softmax(-1)[0]
    expected = plain.gather(1, target[1:, None]).squeeze(1) - other.gather(1, target[1:, None]).squeeze(1)
    torch.testing.assert_close(found[:, 1], expected, atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="4 real positions but 3"):
        occlusion_importance(model.decoder, encoded, model.encode(pad_sequences(versions[:3])), target)


def test_occluding_a_cell_greys_exactly_its_pixels():
    pixels = torch.randn(3, 14, 21)  # a 2 x 3 grid over 14 x 21 pixels: cells of 7 x 7
    copies = occlude_cells(pixels, (2, 3))
    assert copies.shape == (6, 3, 14, 21)
    changed = (copies != pixels).any(1)  # (6, 14, 21)
    expected = torch.zeros(6, 14, 21, dtype=torch.bool)
    for cell in range(6):
        row, column = divmod(cell, 3)
        expected[cell, row * 7 : (row + 1) * 7, column * 7 : (column + 1) * 7] = True
    assert torch.equal(changed, expected)
    assert (copies[4, :, 7:, 7:14] == 0).all()  # greyed: the normalisation's mean, 0
