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


# -- sparse normalisers ---------------------------------------------------------------------------------------
def test_sparsemax_of_a_worked_example():
    from attnkit.attention import sparsemax

    # sorted 1, 0.8, 0.1: the top two qualify (1 + 2 * 0.8 > 1.8, 1 + 3 * 0.1 < 1.9), tau = (1.8 - 1) / 2 = 0.4
    torch.testing.assert_close(sparsemax(torch.tensor([0.1, 1.0, 0.8])), torch.tensor([0.0, 0.6, 0.4]))
    torch.testing.assert_close(sparsemax(torch.zeros(5)), torch.full((5,), 0.2))  # equal scores: uniform


def _entmax15_by_bisection(scores: torch.Tensor) -> torch.Tensor:
    """1.5-entmax written out: the tau with sum(max(z/2 - tau, 0)^2) = 1, found by bisection."""
    half = scores.double() / 2
    low, high = half.max() - 1, half.max()
    for _ in range(100):
        tau = (low + high) / 2
        if (half - tau).clamp_min(0).square().sum() > 1:
            low = tau
        else:
            high = tau
    return (half - (low + high) / 2).clamp_min(0).square().float()


def test_entmax15_is_the_projection_with_exact_zeros():
    from attnkit.attention import entmax15

    generator = torch.Generator().manual_seed(0)
    scores = 3 * torch.randn(6, 9, generator=generator)
    found = entmax15(scores)
    for row, expected in zip(scores, found):
        torch.testing.assert_close(expected, _entmax15_by_bisection(row), atol=1e-5, rtol=0)
    torch.testing.assert_close(found.sum(-1), torch.ones(6))
    assert (found == 0).any()  # spread scores leave some positions exactly out


def _tempered_softmax(scores):
    return torch.softmax(scores / 3, dim=-1)


@pytest.mark.parametrize("normaliser", ["softmax", "sparsemax", "entmax15", "tempered"])
def test_a_normaliser_over_masked_positions_is_the_normaliser_over_the_real_ones(normaliser, monkeypatch):
    """Every normaliser in the registry, and one added the documented way ("tempered": a dense map that is in no
    list but NORMALISERS), which had got masked positions' weight filled in and thrown away: its weights summed to 0.81."""
    from attnkit import attention
    from attnkit.attention import NORMALISERS, normalise

    monkeypatch.setitem(attention.NORMALISERS, "tempered", _tempered_softmax)
    assert set(NORMALISERS) <= {"softmax", "sparsemax", "entmax15", "tempered"}  # a new one is tested here too: add it above

    generator = torch.Generator().manual_seed(1)
    scores = torch.randn(2, 3, 6, generator=generator, requires_grad=True)  # (B, T, L)
    mask = torch.tensor([[True] * 4 + [False] * 2, [True] * 6])
    weights = normalise(scores, mask.unsqueeze(1), normaliser)
    torch.testing.assert_close(weights[0, :, :4], NORMALISERS[normaliser](scores[0, :, :4]))
    assert (weights[0, :, 4:] == 0).all()
    torch.testing.assert_close(weights[1], NORMALISERS[normaliser](scores[1]))
    weights[:, :, 0].sum().backward()  # differentiable: finite gradients reach the scores
    assert scores.grad is not None and scores.grad.isfinite().all()


def test_multi_head_attention_with_a_sparse_normaliser_gives_the_same_output_with_or_without_weights():
    torch.manual_seed(0)
    attention = MultiHeadAttention(8, 2, memory_size=6, normaliser="sparsemax").eval()
    memory, query = torch.randn(2, 5, 6), torch.randn(2, 3, 8)
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2]).unsqueeze(1)  # (B, 1, L)
    keys, values = attention.keys_values(memory)
    plain, _ = attention(query, keys, values, mask)
    with_weights, weights = attention(query, keys, values, mask, need_weights=True)
    torch.testing.assert_close(plain, with_weights)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, 3))
    assert (weights[1, ..., 3:] == 0).all()


@pytest.mark.parametrize("settings", [dict(style="bahdanau", score="additive"), dict(style="luong", score="general")], ids=["bahdanau", "luong"])
def test_an_rnn_decoder_with_sparsemax_gives_weights_that_sum_to_one(vocab, settings):
    from attnkit.analysis import forced_attention
    from attnkit.data.batching import pad_sequences
    from conftest import tiny_model

    model = tiny_model(vocab, normaliser="sparsemax", **settings)
    rows = forced_attention(model.decoder, model.encode(pad_sequences([[4, 5, 6, 7, 8, 9]])), torch.tensor([[2, 5, 9, 6, 3]]))[0]
    torch.testing.assert_close(rows.sum(-1), torch.ones(rows.shape[0]))
    assert rows.min() >= 0


def test_an_unknown_normaliser_is_one_message():
    from attnkit.config import load_config

    with pytest.raises(UserError, match="decoder.normaliser.*softmax.*sparsemax.*entmax15"):
        load_config(None, ["decoder.normaliser=sparsest"])


def test_cuda_attention_never_lets_cudnn_build_a_graph_per_shape():
    """On CUDA the fused kernel may be flash, memory-efficient or the plain one, never cuDNN's (7x slower in bf16 on
    the GPU check's H200, shapes changing every batch); on the CPU PyTorch's own choice stands."""
    from attnkit.attention import fused_attention_backends

    assert torch.backends.cuda.cudnn_sdp_enabled()  # PyTorch's default
    with fused_attention_backends(torch.device("cuda", 0)):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled()
    with fused_attention_backends(torch.device("cpu")):
        assert torch.backends.cuda.cudnn_sdp_enabled()
