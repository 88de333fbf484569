import pytest
import torch

from attnkit.attention import SCORES, Attention, ConcatScore, MultiHeadAttention, masked_softmax
from attnkit.errors import UserError

B, T, L, Q = 3, 4, 5, 6


@pytest.mark.parametrize("score", SCORES)
def test_weights_sum_to_one_and_are_zero_on_padding(score):
    torch.manual_seed(0)
    attention = Attention(score, query_size=Q, memory_size=Q, attention_size=7)
    memory = torch.randn(B, L, Q)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    context, weights = attention(torch.randn(B, T, Q), attention.prepare_keys(memory), memory, mask)
    assert context.shape == (B, T, Q) and weights.shape == (B, T, L)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, T))
    assert (weights.masked_select(~mask.unsqueeze(1).expand_as(weights)) == 0).all()
    # padded memory never leaks into the context: the same queries over memory whose padding is poisoned
    # (huge values, so huge keys and scores there) give the same context and weights ...
    query = torch.randn(B, T, Q)
    poisoned = memory.masked_fill(~mask.unsqueeze(-1), 1e6)
    context_poisoned, weights_poisoned = attention(query, attention.prepare_keys(poisoned), poisoned, mask)
    context_clean, weights_clean = attention(query, attention.prepare_keys(memory), memory, mask)
    torch.testing.assert_close(context_poisoned, context_clean)
    torch.testing.assert_close(weights_poisoned, weights_clean)
    # ... as attention over each example's real positions alone, with no padding at all.
    for b, length in enumerate(mask.sum(1).tolist()):
        real = memory[b : b + 1, :length]  # (1, length, Q)
        alone, _ = attention(query[b : b + 1], attention.prepare_keys(real), real, torch.ones(1, length, dtype=torch.bool))
        torch.testing.assert_close(context_poisoned[b], alone[0])


def test_concat_score_equals_one_linear_layer_over_the_concatenation():
    torch.manual_seed(0)
    score = ConcatScore(query_size=Q, memory_size=4, attention_size=7)
    query, memory = torch.randn(B, T, Q), torch.randn(B, L, 4)
    pairs = torch.cat([query.unsqueeze(2).expand(B, T, L, Q), memory.unsqueeze(1).expand(B, T, L, 4)], -1)  # (B, T, L, Q+4)
    literal = score.energy(torch.tanh(score.combine(pairs))).squeeze(-1)
    torch.testing.assert_close(score(query, score.prepare_keys(memory)), literal)


def test_scaled_dot_is_dot_over_root_d():
    memory, query = torch.randn(B, L, Q), torch.randn(B, T, Q)
    dot, scaled = Attention("dot", Q, Q, 1), Attention("scaled_dot", Q, Q, 1)
    torch.testing.assert_close(scaled.score(query, memory), dot.score(query, memory) / Q**0.5)


@pytest.mark.parametrize("score", ["dot", "scaled_dot"])
def test_dot_scores_need_equal_sizes(score):
    with pytest.raises(UserError, match="needs the decoder hidden size"):
        Attention(score, query_size=4, memory_size=6, attention_size=3)


def test_masked_softmax_matches_softmax_over_real_positions():
    scores = torch.randn(2, 1, 4)
    mask = torch.tensor([[True, True, False, False], [True, True, True, True]])
    weights = masked_softmax(scores, mask)
    torch.testing.assert_close(weights[0, 0, :2], torch.softmax(scores[0, 0, :2], -1))
    torch.testing.assert_close(weights[1], torch.softmax(scores[1], -1))


def test_no_attention_weighs_every_real_position_the_same_and_averages_the_memory():
    from attnkit.attention import NO_ATTENTION

    attention = Attention(NO_ATTENTION, query_size=3, memory_size=4, attention_size=5)
    memory = torch.randn(2, 6, 4)
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    context, weights = attention(torch.randn(2, 3, 3), attention.prepare_keys(memory), memory, mask)
    torch.testing.assert_close(weights[1, 0], torch.tensor([0.25] * 4 + [0.0] * 2))
    torch.testing.assert_close(context[0, 2], memory[0].mean(0))
    torch.testing.assert_close(context[1, 1], memory[1, :4].mean(0))


def test_causal_attention_is_the_fused_kernel_s_is_causal_and_equals_the_explicit_mask():
    """The decoder's self-attention asks for ``causal`` (is_causal for the fused kernel); the weights path builds
    the lower-triangular mask itself; both equal attention under that mask given explicitly."""
    torch.manual_seed(0)
    attention = MultiHeadAttention(8, 2).eval()
    x = torch.randn(3, 5, 8)
    keys, values = attention.keys_values(x)
    lower = torch.ones(5, 5, dtype=torch.bool).tril().unsqueeze(0)  # (1, T, T)
    explicit, _ = attention(x, keys, values, lower)
    fused, _ = attention(x, keys, values, None, causal=True)
    weighed, weights = attention(x, keys, values, None, need_weights=True, causal=True)
    assert torch.allclose(fused, explicit, atol=1e-6) and torch.allclose(weighed, explicit, atol=1e-6)
    assert torch.all(weights.triu(1) == 0)
    with pytest.raises(ValueError, match="no mask"):
        attention(x, keys, values, lower, causal=True)
