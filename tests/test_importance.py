"""Importance estimators (attnkit.importance) and their agreement with attention: hand-made answers."""

import argparse
import dataclasses

import pytest
import torch

from attnkit.analysis import agreement, agreement_means, attention_importance, forced_attention_by_head, rank_correlation, ranks
from attnkit.data.batching import pad_sequences
from attnkit.data.images import grey_cells
from attnkit.decoders.rnn import RNNState
from attnkit.errors import UserError
from attnkit.importance import (
    ESTIMATORS,
    HideableSource,
    ImportanceSettings,
    HiddenFromAttention,
    KeptPositions,
    at_memory,
    add_importance_arguments,
    importance_label,
    importance_maps,
    input_importance,
    norm_weighted_attention,
    parse_hiding,
    presence_model,
    random_mask_importance,
    random_masks,
    settings_from_arguments,
    window_importance,
)
from attnkit.interfaces import DecoderOutput, EncoderOutput, StepOutput, Tokens
from conftest import TINY_TRANSFORMER, tiny_model

READ = 3  # the one memory position the stub decoder reads


class _ReadsOnlyPosition3:
    """A stub decoder whose next word depends only on memory position 3: word 4 (by 10 nats) when position 3 is
    visible and its memory is not zeroed out, else word 5 (smoothly in between, so gradients reach position 3 and
    no other). Its attention is uniform over the visible positions."""

    def init_state(self, encoded):
        return RNNState(torch.zeros(1, encoded.batch_size, 1), None, None, encoded.memory, encoded.memory, encoded.mask)

    def _logits(self, sees: torch.Tensor, rows: int) -> torch.Tensor:
        logits = torch.zeros(rows, 8)
        logits[:, 4], logits[:, 5] = 10 * sees, 10 * (1 - sees)
        return logits

    def _sees(self, memory, mask) -> torch.Tensor:
        return mask[:, READ].float() * memory[:, READ].mean(-1)  # (B,): 1 with its memory of ones, 0 zeroed

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


def _hideable(source: EncoderOutput) -> HideableSource:
    """The stub's source with its real positions hideable: a hidden position's memory is zeroed (what greying its
    input does, for the stub)."""
    real = int(source.mask.sum())

    def encode_keeping(keep: torch.Tensor) -> EncoderOutput:
        rows = keep.shape[0]
        kept = torch.nn.functional.pad(keep.float(), (0, source.mask.shape[1] - real))  # (B, L): padding stays
        memory = source.memory.expand(rows, -1, -1) * kept.unsqueeze(-1)
        return EncoderOutput(memory, source.mask.expand(rows, -1), source.init_state.expand(rows, -1), source.layout)

    return HideableSource((real,), encode_keeping, "text")


TARGET = torch.tensor([2, 4, 4, 3])  # <bos> w1 w2 <eos>: 3 forced steps


@pytest.mark.parametrize("form", ["attention", "input", "random_masks", "gradients"])
def test_a_decoder_that_reads_only_position_3_has_importance_only_there(form):
    source = _source()
    settings = ImportanceSettings((form,), masks=512, gradient_steps=64)
    found = importance_maps(_ReadsOnlyPosition3(), source, _hideable(source), TARGET, settings)[form]
    assert found.shape == (3, 5)  # the real positions
    noise = 1.0 if form == "random_masks" else 1e-4  # random masks estimate: 512 draws leave a spread of about 0.45 nats
    torch.testing.assert_close(found[:2, READ], torch.full((2,), 10.0), atol=max(noise, 0.05), rtol=0)  # w1, w2 (word 4) need position 3
    others = found[:, [0, 1, 2, 4]]
    torch.testing.assert_close(others, torch.zeros_like(others), atol=noise, rtol=0)


def test_windows_average_the_windows_over_each_position_and_sum_the_sizes():
    """Windows of 1 and 2 over five words, only word 3 read (10 nats): size 1 gives 10 at word 3; size 2's windows
    are (0 1) (1 2) (2 3) (3 4), so word 2 has the mean of 0 and 10, words 3 and 4 (covered by one window only)
    10 each, as Captum's Occlusion averages them."""
    source = _source()
    stub = KeptPositions(_ReadsOnlyPosition3(), _hideable(source), TARGET, batch_size=64)
    found = window_importance(stub, ImportanceSettings(("windows",), window_sizes=(1, 2)), torch.device("cpu"))
    torch.testing.assert_close(found[0], torch.tensor([0.0, 0.0, 5.0, 20.0, 10.0]), atol=0.01, rtol=0)
    assert int(found[0].argmax()) == READ
    longer = window_importance(stub, ImportanceSettings(("windows",), window_sizes=(9,)), torch.device("cpu"))
    torch.testing.assert_close(longer[0], torch.full((5,), 10.0), atol=0.01, rtol=0)  # a window longer than the sentence hides it whole


def test_hiding_in_the_memory_takes_each_vector_from_the_whole_or_the_hidden_input():
    memory = torch.arange(12.0).view(1, 4, 3)

    def encode_keeping(keep):  # a stand-in encoder whose every output position mixes its neighbours (as a backbone does)
        kept = memory * keep.unsqueeze(-1)
        mixed = kept + kept.roll(1, dims=1)
        return EncoderOutput(mixed, torch.ones(keep.shape[0], 4, dtype=torch.bool), torch.zeros(keep.shape[0], 3), Tokens(torch.tensor([4])))

    source = HideableSource((4,), encode_keeping, "text")
    keep = torch.tensor([[True, False, True, True]])
    at_input, in_memory = source.encode_keeping(keep).memory, at_memory(source, torch.device("cpu")).encode_keeping(keep).memory
    whole = encode_keeping(torch.ones(1, 4, dtype=torch.bool)).memory
    assert not torch.equal(at_input[0, 2], whole[0, 2])  # at the input, hiding word 1 reaches its neighbour
    torch.testing.assert_close(in_memory[0, [0, 2, 3]], whole[0, [0, 2, 3]])  # in the memory it stays at position 1
    torch.testing.assert_close(in_memory[0, 1], torch.zeros(3))  # whose vector is the wholly hidden input's


def test_hidden_from_attention_leaves_something_to_attend_to():
    source = _source()
    forward = HiddenFromAttention(_ReadsOnlyPosition3(), source, TARGET, (5,), batch_size=8)
    longest = window_importance(forward, ImportanceSettings(("windows",), window_sizes=(9,)), torch.device("cpu"))  # cut to 4 words
    assert longest.shape == (3, 5) and not longest.isnan().any()
    with pytest.raises(ValueError, match="hides every position"):
        forward(torch.zeros(1, 5))


def test_random_masks_hide_their_share_and_repeat_with_their_seed():
    keep = random_masks(10, 2000, 0.3, torch.Generator().manual_seed(1))
    assert keep.shape == (2000, 10) and abs(float((~keep).float().mean()) - 0.3) < 0.02
    assert torch.equal(keep, random_masks(10, 2000, 0.3, torch.Generator().manual_seed(1)))
    assert not torch.equal(keep, random_masks(10, 2000, 0.3, torch.Generator().manual_seed(2)))
    source = _source()
    settings = ImportanceSettings(("random_masks",), masks=16, seed=5)
    stub = KeptPositions(_ReadsOnlyPosition3(), _hideable(source), TARGET, batch_size=64)
    first = random_mask_importance(stub, settings, torch.device("cpu"))
    torch.testing.assert_close(first, random_mask_importance(stub, settings, torch.device("cpu")))
    assert random_masks(2, 200, 0.9, torch.Generator().manual_seed(0)).any(1).all()  # every mask keeps something


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
    # From the input: position 1's input replaced by <unk>, the whole pass again; its column is what the pass lost.
    def encode_keeping(keep):
        ids = torch.tensor(source_ids).expand(keep.shape[0], -1)
        return model.encode(pad_sequences(torch.where(keep, ids, vocab.unk_index).tolist()))

    found = input_importance(KeptPositions(model.decoder, HideableSource((4,), encode_keeping, "text"), target, 64), ImportanceSettings(), torch.device("cpu"))
    with torch.no_grad():
        plain = model.decoder(encoded, target[:-1].unsqueeze(0)).logits.log_softmax(-1)[0]  # (T, V)
        other = model.decoder(model.encode(pad_sequences([[4, vocab.unk_index, 6, 7]])), target[:-1].unsqueeze(0)).logits.log_softmax(-1)[0]
    expected = plain.gather(1, target[1:, None]).squeeze(1) - other.gather(1, target[1:, None]).squeeze(1)
    torch.testing.assert_close(found[:, 1], expected, atol=1e-5, rtol=1e-4)
    # Hidden from the attention, one position at a time, the same estimator is importance through attention.
    from_attention = importance_maps(model.decoder, encoded, HideableSource((4,), encode_keeping, "text"), target, ImportanceSettings(("input",), hide_at="attention"))
    torch.testing.assert_close(from_attention["input"], through, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("settings", [dict(style="bahdanau", score="additive", rnn="lstm"), TINY_TRANSFORMER], ids=["bahdanau", "transformer"])
def test_norm_weighted_attention_weighs_each_position_by_what_it_adds(vocab, settings):
    """The value vectors are what each position adds: weighted by the attention and summed (plus the output bias,
    for a Transformer layer) they give the attention block's output; norm-weighted attention reweights by their norms."""
    model = tiny_model(vocab, **settings)
    encoded = model.encode(pad_sequences([[4, 5, 6, 7, 8]]))
    target = torch.tensor([[2, 5, 9, 6, 3]])
    _, heads = forced_attention_by_head(model.decoder, encoded, target)  # (T, N, h, L) per example
    values = model.decoder.value_vectors(encoded)[0]  # (N, h, L, M)
    if settings is TINY_TRANSFORMER:
        layer = model.decoder.layers[0].cross_attention
        query = torch.randn(1, 1, values.shape[-1])
        keys, value_heads = layer.keys_values(encoded.memory)
        output, weights = layer(query, keys, value_heads, encoded.mask.unsqueeze(1), need_weights=True)  # (1, 1, M), (1, h, 1, L)
        rebuilt = torch.einsum("hl,hlm->m", weights[0, :, 0], values[0]) + layer.output.bias
        torch.testing.assert_close(rebuilt, output[0, 0], atol=1e-5, rtol=1e-4)
        one_head = norm_weighted_attention(heads[0], values, 0, 1)
        expected = heads[0][:, 0, 1] * values[0, 1].norm(dim=-1)
    else:
        torch.testing.assert_close(values[0, 0], encoded.memory[0])  # the context is the attention-weighted memory
        one_head = norm_weighted_attention(heads[0], values, 0, -1)
        expected = heads[0][:, 0, 0] * encoded.memory[0].norm(dim=-1)
    torch.testing.assert_close(one_head, expected / expected.sum(-1, keepdim=True))
    maps = importance_maps(model.decoder, encoded, None, target[0], ImportanceSettings(("norm_weighted",)))
    torch.testing.assert_close(maps["norm_weighted"].sum(-1), torch.ones(4))


def test_greying_cells_greys_exactly_their_pixels():
    pixels = torch.randn(3, 14, 21)  # a 2 x 3 grid over 14 x 21 pixels: cells of 7 x 7
    keep = ~torch.eye(6, dtype=torch.bool).view(6, 2, 3)  # copy k hides cell k
    copies = grey_cells(pixels, keep)
    assert copies.shape == (6, 3, 14, 21)
    changed = (copies != pixels).any(1)  # (6, 14, 21)
    expected = torch.zeros(6, 14, 21, dtype=torch.bool)
    for cell in range(6):
        row, column = divmod(cell, 3)
        expected[cell, row * 7 : (row + 1) * 7, column * 7 : (column + 1) * 7] = True
    assert torch.equal(changed, expected)
    assert (copies[4, :, 7:, 7:14] == 0).all()  # greyed: the normalisation's mean, 0
    uneven = grey_cells(torch.ones(1, 10, 10), torch.tensor([[[True, False, True]] * 3]))  # cell edges rounded: 3, 7
    assert torch.equal(uneven[0, 0, 0], torch.tensor([1.0, 1, 1, 0, 0, 0, 0, 1, 1, 1]))


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(estimators=("windows", "lime")), "unknown importance estimator 'lime'"),
        (dict(estimators=()), "unknown importance estimator"),
        (dict(mask_share=0.0), "strictly between 0 and 1"),
        (dict(mask_share=1.0), "strictly between 0 and 1"),
        (dict(mask_share=float("nan")), "strictly between 0 and 1"),
        (dict(masks=0), "random masks must be 1 or more"),
        (dict(window_sizes=(1, 0)), "window sizes must be whole numbers of 1 or more"),
        (dict(window_sizes=()), "window sizes must be whole numbers of 1 or more"),
        (dict(hide_at="output"), "unknown place to hide a position 'output'"),
        (dict(hide_at={"image": "memory", "text": "output"}), "unknown place to hide a position 'output'"),
        (dict(hide_at={"picture": "memory"}), "unknown modality 'picture'"),
    ],
)
def test_bad_estimator_settings_are_refused_before_any_work(settings, message):
    with pytest.raises(UserError, match=message):
        ImportanceSettings(**settings)


def test_each_modality_is_hidden_where_the_settings_say():
    source = _source()
    settings = ImportanceSettings(("input",), hide_at={"image": "attention"})  # text keeps its default place, the input
    assert settings.hide_at == {"image": "attention", "text": "input"}
    as_image = presence_model(_ReadsOnlyPosition3(), source, dataclasses.replace(_hideable(source), modality="image"), TARGET, settings)
    as_text = presence_model(_ReadsOnlyPosition3(), source, _hideable(source), TARGET, settings)
    assert isinstance(as_image, HiddenFromAttention) and isinstance(as_text, KeptPositions)
    in_memory = presence_model(_ReadsOnlyPosition3(), source, _hideable(source), TARGET, ImportanceSettings(("input",), hide_at="memory"))
    assert isinstance(in_memory, KeptPositions) and in_memory.source.modality == "text" and in_memory.source.encode_keeping is not _hideable(source).encode_keeping


@pytest.mark.parametrize("place", ["memory", "image=memory", "image=memory,text=attention", None])
def test_the_settings_go_through_the_command_line_unchanged(place):
    parser = argparse.ArgumentParser()
    add_importance_arguments(parser)
    settings = ImportanceSettings(("windows", "random_masks"), window_sizes=(1, 3), masks=7, mask_share=0.3, **({} if place is None else {"hide_at": parse_hiding(place)}))
    assert settings_from_arguments(parser.parse_args(settings.as_arguments())) == settings
    assert settings_from_arguments(parser.parse_args([])) == ImportanceSettings()


def test_labels_say_where_positions_were_hidden():
    assert importance_label("input") == "importance, one position hidden"
    assert importance_label("windows", {"image": "attention"}) == "importance, windows of positions hidden from attention"
    assert importance_label("input", {"image": "attention", "text": "input"}) == "importance, one position hidden (cells from attention, words at the input)"
    assert importance_label("input", {"image": "memory", "text": "memory"}) == "importance, one position hidden in the memory"
    assert importance_label("attention", {"image": "memory"}) == "importance through attention"  # hidden from attention by its nature


def test_a_place_to_hide_at_without_its_modality_is_refused():
    with pytest.raises(UserError, match="MODALITY=PLACE pairs"):
        parse_hiding("image=memory,text")


def test_windows_larger_than_the_grid_are_refused():
    ImportanceSettings(("windows",), window_sizes=(1, 2, 3)).check_grid((3, 3))
    ImportanceSettings(("input",), window_sizes=(9,)).check_grid((3, 3))  # no windows asked for: nothing to refuse
    with pytest.raises(UserError, match="a window of 4 x 4 cells does not fit the 3 x 3 grid"):
        ImportanceSettings(("windows",), window_sizes=(1, 4)).check_grid((3, 3))
    assert set(ESTIMATORS) >= {"attention", "input", "windows", "random_masks", "gradients", "norm_weighted"}
