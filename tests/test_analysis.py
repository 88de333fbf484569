import dataclasses
import math

import pytest
import torch
from nltk.translate.metrics import alignment_error_rate

from attnkit.analysis import (
    attention_alignment,
    cell_boxes,
    coverage,
    effective_positions,
    entropy,
    erasure,
    EMITTING,
    READING,
    forced_attention,
    is_punctuation,
    word_attention,
    image_grounding,
    localisation,
    peak_weight,
    mostly_inside,
    quadrant_weights,
    span_weights,
    summarise,
    text_grounding,
)
from attnkit.data.batching import pad_sequences
from attnkit.decoders.rnn import RNNState
from attnkit.interfaces import StepOutput
from attnkit.interfaces import EncoderOutput, Tokens
from conftest import TINY_TRANSFORMER, tiny_model


def test_uniform_rows_have_maximal_entropy_and_one_hot_rows_none():
    uniform, one_hot = torch.full((2, 8), 1 / 8), torch.eye(8)[:2]
    torch.testing.assert_close(entropy(uniform), torch.full((2,), math.log(8)))
    torch.testing.assert_close(entropy(one_hot), torch.zeros(2))
    torch.testing.assert_close(effective_positions(uniform), torch.full((2,), 8.0))
    torch.testing.assert_close(effective_positions(one_hot), torch.ones(2))
    torch.testing.assert_close(peak_weight(uniform), torch.full((2,), 1 / 8))
    torch.testing.assert_close(coverage(one_hot), torch.tensor([1.0, 1, 0, 0, 0, 0, 0, 0]))
    summary = summarise(uniform).mean()
    assert summary["normalised_entropy"] == 1.0 and summary["positions"] == 8


def test_cells_tile_the_image_row_major():
    cells = cell_boxes((2, 3), (90, 60))  # 2 rows, 3 columns over a 90 x 60 image
    assert cells.shape == (6, 4)
    torch.testing.assert_close(cells[0], torch.tensor([0.0, 0, 30, 30]))
    torch.testing.assert_close(cells[5], torch.tensor([60.0, 30, 90, 60]))


def test_one_hot_attention_in_the_box_hits_and_outside_misses():
    grid, size = (4, 4), (64, 64)
    box = (34, 2, 60, 14)  # top right: cells (row 0, columns 2 and 3)
    inside, outside = torch.zeros(1, 16), torch.zeros(1, 16)  # one word each, naming object 0
    inside[0, 3], outside[0, 12] = 1.0, 1.0
    hit, miss = (image_grounding(weights, [0], [box], grid, size) for weights in (inside, outside))
    assert (hit.words, hit.hits) == (1, 1) and (miss.words, miss.hits) == (1, 0)
    assert miss.mass == 0.0
    # Cell 3 spans x 48..64, y 0..16; the box covers x 48..60, y 2..14: 12 * 12 / 256 of it.
    assert math.isclose(hit.mass, 144 / 256, rel_tol=1e-6)
    whole = (0, 0, 64, 64)
    assert math.isclose(image_grounding(torch.full((1, 16), 1 / 16), [0], [whole], grid, size).mass, 1.0, rel_tol=1e-6)


def test_image_grounding_scores_only_referring_words():
    grid, size = (2, 2), (32, 32)
    boxes = [(0, 0, 16, 16), (16, 16, 32, 32)]  # object 0 top left, object 1 bottom right
    attention = torch.tensor([[1.0, 0, 0, 0], [0, 0, 0, 1.0], [0, 0, 0, 1.0], [0.25, 0.25, 0.25, 0.25]])
    scored = image_grounding(attention, [None, 0, 1, 1], boxes, grid, size)
    assert (scored.words, scored.hits) == (3, 1)  # step 1 looks at object 1 for a word about object 0
    assert scored.misses_on_other_objects == 1  # step 1 on object 1; step 3 is flat: its peak is every cell, on no one object
    assert math.isclose(scored.mean_mass, (0 + 1 + 0.25) / 3)
    assert (scored + scored).hit_rate == scored.hit_rate and (scored + scored).misses_on_other_objects == 2
    background = image_grounding(torch.tensor([[0, 1.0, 0, 0]]), [0], boxes, grid, size)  # top right: no object there
    assert (background.hits, background.misses_on_other_objects) == (0, 0)


def test_a_flat_row_hits_nothing_and_links_nothing():
    """Importance that lost nothing anywhere is drawn evenly; its first position is no peak. Scored by its argmax
    it would hit an object in the top-left cell and link a word to the first source word. A tie that lies wholly
    in the region still hits it (test_joined_sources_score_the_same_way)."""
    flat, peaked = torch.full((1, 4), 0.25), torch.tensor([[0.7, 0.1, 0.1, 0.1]])
    top_left = [(0, 0, 16, 16)]
    assert image_grounding(flat, [0], top_left, (2, 2), (32, 32)).hits == 0
    assert image_grounding(peaked, [0], top_left, (2, 2), (32, 32)).hits == 1
    assert attention_alignment(torch.cat([flat, peaked])) == {(0, 1)}  # the flat word links nowhere
    assert text_grounding(flat, {(0, 0)}, {(0, 0)}, target_words=1).aer == 1.0  # its sure link missed
    _, hits = localisation(torch.cat([flat, peaked]), torch.tensor([1.0, 0.0, 0.0, 0.0]))
    assert hits.tolist() == [False, True]


def test_aer_of_a_known_alignment_matches_nltk():
    # Source "un cercle rouge", target "a red circle <eos>": gold a-un, red-rouge, circle-cercle.
    sure = {(0, 0), (2, 1), (1, 2)}
    perfect = torch.tensor([[1.0, 0, 0], [0, 0, 1.0], [0, 1.0, 0], [1.0, 0, 0]])
    assert text_grounding(perfect, sure, sure, target_words=3).aer == 0.0
    monotone = torch.eye(3)
    scored = text_grounding(monotone, sure, sure, target_words=3)
    assert attention_alignment(monotone) == {(0, 0), (1, 1), (2, 2)}
    assert math.isclose(scored.aer, alignment_error_rate(frozenset(sure), frozenset({(0, 0), (1, 1), (2, 2)})))
    assert math.isclose(scored.aer, 1 - 2 / 6)
    assert scored.peak_on_aligned_rate == 1 / 3
    # Possible links count for precision but are not required for recall.
    loose = text_grounding(monotone, {(0, 0)}, {(1, 1), (2, 2)}, target_words=3)
    assert math.isclose(loose.aer, 1 - (1 + 3) / (3 + 1))
    # Pooled sentences weigh every link once.
    pooled = text_grounding(perfect, sure, sure, 3, sentence=0) + text_grounding(monotone, sure, sure, 3, sentence=1)
    assert math.isclose(pooled.aer, 1 - (3 + 1 + 3 + 1) / (6 + 6))
    # One kind of word at a time: only its words are linked, against its gold links; the kinds added up are the whole.
    article = text_grounding(monotone, {(0, 0)}, {(0, 0)}, 3, scored=[0])
    assert article.hypothesis == frozenset({(0, 0, 0)}) and article.aer == 0.0  # "a" -> "un": no other word's link counts
    rest = text_grounding(monotone, {(2, 1), (1, 2)}, {(2, 1), (1, 2)}, 3, scored=[1, 2])
    assert math.isclose((article + rest).aer, scored.aer)


def test_forced_attention_returns_one_row_per_target_token_over_real_positions(vocab):
    model = tiny_model(vocab)
    source = pad_sequences([[4, 5, 6], [7, 8]])
    targets = pad_sequences([[2, 5, 6, 3], [2, 9, 3]]).ids
    rows = forced_attention(model.decoder, model.encode(source), targets)
    assert [r.shape for r in rows] == [(3, 3), (2, 2)]
    for r in rows:
        torch.testing.assert_close(r.sum(-1), torch.ones(r.shape[0]))


@pytest.mark.parametrize("settings", [dict(style="luong"), dict(style="bahdanau", score="additive"), TINY_TRANSFORMER], ids=["luong", "bahdanau", "transformer"])
def test_the_reading_step_is_the_first_whose_attention_depends_on_the_word(vocab, settings):
    """Change word w_1 of a forced target: the attention of the steps before the decoder's reading_offset + 1 stays the
    same, the step there changes; so 'reading' picks the first step whose query has read the word."""
    model = tiny_model(vocab, **settings)
    encoded = model.encode(pad_sequences([[4, 5, 6, 7]]))
    one, other = (forced_attention(model.decoder, encoded, torch.tensor([[2, 4, word, 6, 3]]), read_eos=True)[0] for word in (5, 9))
    assert one.shape == (5, 4)  # <bos> w0 w1 w2 <eos> read: 3 words + <eos> + the step that reads <eos>
    offset = model.decoder.reading_offset
    torch.testing.assert_close(one[: 1 + offset], other[: 1 + offset])  # steps 0 .. offset have not read w1
    assert not torch.allclose(one[1 + offset], other[1 + offset])
    words = 3
    torch.testing.assert_close(word_attention(one, words, offset, READING), one[offset : offset + words])
    torch.testing.assert_close(word_attention(one, words, offset, EMITTING), one[:words])
    with pytest.raises(ValueError):
        word_attention(one[: offset + words - 1], words, offset, READING)


class _ReadsOnePosition:
    """A stub decoder whose next word depends only on whether memory position 2 is visible: word 4 when it is
    (by 10 nats), else word 5; the attention is uniform over the visible positions."""

    def init_state(self, encoded):
        rows = encoded.batch_size
        return RNNState(torch.zeros(1, rows, 1), None, None, encoded.memory, encoded.memory, encoded.mask)

    def step(self, previous, state):
        sees = state.mask[:, 2].float()  # (B,)
        logits = torch.zeros(previous.shape[0], 8)
        logits[:, 4], logits[:, 5] = 10 * sees, 10 * (1 - sees)
        attention = state.mask.float() / state.mask.sum(1, keepdim=True)  # (B, L)
        return StepOutput(logits, attention, state)


def test_erasure_finds_the_one_position_a_stub_decoder_reads():
    encoded = EncoderOutput(torch.zeros(1, 5, 3), torch.tensor([[True, True, True, True, False]]), torch.zeros(1, 3), Tokens(torch.tensor([4])))
    found = erasure(_ReadsOnePosition(), encoded, torch.tensor([2, 4, 4, 3]), draws=40, generator=torch.Generator().manual_seed(0))
    # Uniform attention: the "peak" is position 0 (first of equals), the lowest the last real one (3): neither is 2.
    torch.testing.assert_close(found.peak_drop, torch.zeros(3), atol=1e-4, rtol=0)
    assert found.random_drop[:2].min() > 1.0 and 0.1 < float(found.random_flip[0]) < 0.5  # a quarter of the draws hit position 2
    # The top-weighted positions are removed in order 0, 1, 2: the third removal changes the word, 3 of 4 real positions.
    torch.testing.assert_close(found.flip_share[:2], torch.full((2,), 0.75))


@pytest.mark.parametrize(
    "settings",
    [dict(style="luong", input_feeding=True), dict(style="bahdanau", score="additive", rnn="lstm"), TINY_TRANSFORMER],
    ids=["luong", "bahdanau", "transformer"],
)
def test_batched_erasure_equals_one_step_at_a_time(vocab, settings):
    model = tiny_model(vocab, **settings)
    encoded = model.encode(pad_sequences([[4, 5, 6, 7, 8]]))
    target = torch.tensor([2, 5, 9, 6, 3])
    found = erasure(model.decoder, encoded, target, draws=2, generator=torch.Generator().manual_seed(1))
    decoder, state = model.decoder, model.decoder.init_state(encoded)
    for t in range(4):  # step t again from the same state, without its peak position
        out = decoder.step(target[t : t + 1], state)
        without_peak = encoded.mask.clone()
        without_peak[0, int(out.attention[0].argmax())] = False
        erased = decoder.step(target[t : t + 1], dataclasses.replace(state, mask=without_peak))
        expected = out.logits.log_softmax(-1)[0, target[t + 1]] - erased.logits.log_softmax(-1)[0, target[t + 1]]
        torch.testing.assert_close(found.peak_drop[t], expected, atol=1e-5, rtol=1e-4)
        state = out.state


# -- localisation on mosaics and joined sources (issue 19) ---------------------------------------------------

@pytest.mark.parametrize("grid", [(2, 2), (4, 4), (7, 7)])
def test_the_quadrants_of_a_mosaic_share_out_every_cell(grid):
    quadrants = torch.stack([quadrant_weights(grid, q) for q in range(4)])  # (4, L)
    assert torch.allclose(quadrants.sum(0), torch.ones(grid[0] * grid[1]))
    assert torch.allclose(quadrants.mean(1), torch.full((4,), 0.25))  # each a quarter of the mosaic
    top_left = quadrant_weights(grid, 0).reshape(grid)
    assert top_left[0, 0] == 1 and top_left[-1, -1] == 0
    if grid[0] % 2:  # the middle row and column straddle: half a cell in each quadrant they touch
        assert top_left[grid[0] // 2, 0] == pytest.approx(0.5) and top_left[grid[0] // 2, grid[1] // 2] == pytest.approx(0.25)


def test_all_mass_in_the_right_region_scores_one_and_uniform_attention_its_share():
    grid = (7, 7)
    region = quadrant_weights(grid, 3)
    inside = torch.zeros(2, 49)
    inside[0, 48] = 1.0  # the bottom-right corner cell
    inside[1, [40, 41, 47]] = torch.tensor([0.2, 0.3, 0.5])  # spread over cells wholly inside
    mass, hits = localisation(inside, region)
    assert torch.allclose(mass, torch.ones(2)) and hits.all()
    uniform = torch.full((3, 49), 1 / 49)
    mass, _ = localisation(uniform, region)
    assert torch.allclose(mass, torch.full((3,), 0.25))
    elsewhere = torch.zeros(1, 49)
    elsewhere[0, 0] = 1.0
    assert localisation(elsewhere, region)[0].item() == 0 and not localisation(elsewhere, region)[1].item()
    centre = torch.zeros(1, 49)
    centre[0, 24] = 1.0  # the middle cell: a quarter in each quadrant, a hit for none
    mass, hits = localisation(centre, region)
    assert mass.item() == pytest.approx(0.25) and not hits.item()


@pytest.mark.parametrize("side", [7, 8, 9, 14])
def test_a_peak_hits_a_quadrant_only_on_a_cell_mostly_inside_it_on_any_grid(side):
    """float32 made a straddling cell's share 0.4999998 or 0.5000002 by where it lay: on 7 x 7 the quadrants owned
    9, 12, 12 and 15 cells, and a peak blind to the photo scored 24 % pointing where the rule allows it 18 %."""
    cells = side * side
    owned = (side // 2) ** 2  # a quadrant's cells wholly inside it; an odd grid's middle row and column: no one's
    one_hot = torch.eye(cells)  # (L, L): a peak on each cell in turn
    for quadrant in range(4):
        region = quadrant_weights((side, side), quadrant)
        assert int(mostly_inside(region).sum()) == owned
        assert int(localisation(one_hot, region)[1].sum()) == owned
    from attnkit.comparison import LocalisationTally

    tally = LocalisationTally()
    tally.add(["content"], torch.ones(1), torch.ones(1, dtype=torch.bool), quadrant_weights((side, side), 3))
    assert tally.summary()["pointing_chance"] == pytest.approx(owned / cells, abs=1e-4)


def test_joined_sources_score_the_same_way():
    lengths = [3, 5, 2, 6]
    region = span_weights(lengths, 1)
    assert region.tolist() == [0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0]
    attention = torch.zeros(2, 16)
    attention[0, 3:8] = 0.2  # all on its own sentence
    attention[1] = 1 / 16  # uniform: the sentence's share of the joined source
    mass, hits = localisation(attention, region)
    assert mass.tolist() == pytest.approx([1.0, 5 / 16]) and hits[0]
    with pytest.raises(ValueError, match="no source 4"):
        span_weights(lengths, 4)
    with pytest.raises(ValueError, match="quadrants 0-3"):
        quadrant_weights((7, 7), 4)


# hand-made tokens: (token, is punctuation, its word group)
PUNCTUATION_CASES = [
    ("$", True, "punctuation"),  # a currency symbol (Unicode Sc): punctuation for both now, once not for the head statistics
    ("+", True, "punctuation"),  # a maths symbol (Sm): likewise
    ("\u2581", False, "content"),  # sentencepiece's word mark alone: nothing left, so not punctuation (the word groups once said it was)
    ("\u2581,", True, "punctuation"),  # a comma that starts a word
    ("\u2026", True, "punctuation"),  # one ellipsis character
    ("-", True, "punctuation"),
    ("'s", False, "function"),  # a letter makes it a word
    ("\u00e7a", False, "content"),  # ça: a letter outside ASCII
    ("2", False, "content"),  # a digit
]


@pytest.mark.parametrize("token, punctuation, group", PUNCTUATION_CASES)
def test_one_punctuation_rule_serves_the_word_groups_and_the_head_statistics(token, punctuation, group):
    from attnkit.comparison import word_group
    from attnkit.vocab import Vocabulary

    assert is_punctuation(token) is punctuation
    assert word_group(token, Vocabulary.build([[token]])) == group
    assert not is_punctuation("")

