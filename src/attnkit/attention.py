"""Attention score functions and masked softmax.

Legend: B batch, T query steps (1 while decoding step by step), L memory length,
Q query size (decoder state), D memory size, A attention (hidden) size.

Naming follows Luong et al. (2015) plus Bahdanau's additive score and the
scaled dot product, with ``h`` the decoder query and ``s`` a memory vector:

=============  ================================  =========================
``dot``        h . s                              needs Q == D
``general``    h^T W s                            W: D -> Q
``concat``     v^T tanh(W [h; s] + b)             one W over the concatenation
``additive``   v^T tanh(W1 s + W2 h + b)          Bahdanau et al. (2015)
``scaled_dot`` h . s / sqrt(D)                    needs Q == D
=============  ================================  =========================

``concat`` and ``additive`` describe the same family of functions (a single
matrix over ``[h; s]`` is two matrices side by side); both exist so a config
reads like the paper it reproduces and its parameters carry that paper's names.

Every score splits into a per-batch part, :meth:`AttentionScore.prepare_keys`
(the memory projection, computed once per source and kept in the decoder
*state* so beam search can reorder it), and a per-step part, ``forward``.

:class:`MultiHeadAttention` is the Transformer's attention (Vaswani et al. 2017):
h heads of scaled dot product over their own projections of query, keys and
values (legend there).
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnkit.errors import UserError

# On an H200 the Transformer translator trained 7x slower in bf16 than in fp32, and its encoder ran cuDNN's fused
# attention (BENCHMARKS.md, the GPU check). The suspected cause: cuDNN builds (and caches) a graph for every new
# shape, and a batch's source length changes from step to step. Flash and memory-efficient attention take each
# shape as it comes.
CUDA_ATTENTION_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def fused_attention_backends(device: torch.device) -> contextlib.AbstractContextManager:
    """The fused attention kernels ``scaled_dot_product_attention`` may choose from on ``device``: on CUDA all but
    cuDNN's; elsewhere PyTorch's own choice."""
    return sdpa_kernel(CUDA_ATTENTION_BACKENDS) if device.type == "cuda" else contextlib.nullcontext()


def masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """Softmax over the last axis where ``mask`` is True; masked positions get exactly 0.

    ``scores`` is (B, T, L) and ``mask`` (B, L); every row must have at least one
    real position (encoders never produce empty inputs).
    """
    return normalise(scores, mask.unsqueeze(1), "softmax")


# -- normalisers: scores -> weights that sum to 1 --------------------------------------------------------------
# Softmax gives every position some weight; sparsemax (Martins and Astudillo 2016) and 1.5-entmax (Peters et al.
# 2019) are Euclidean / Tsallis projections onto the simplex that give exactly 0 to positions scored far enough
# below the best, so a step's attention can rest on a few positions only. Both are exact, sort-based, and
# differentiable almost everywhere through autograd.
def sparsemax(scores: Tensor) -> Tensor:
    """argmin_p ||p - z||^2 over the simplex, along the last axis: max(z - tau, 0) with sum 1."""
    scores = scores - scores.amax(-1, keepdim=True)  # the same projection; small sums keep fp32's precision
    ordered = scores.sort(dim=-1, descending=True).values  # (..., L)
    ks = torch.arange(1, scores.shape[-1] + 1, device=scores.device, dtype=scores.dtype)  # (L,)
    cumulative = ordered.cumsum(-1)
    support = (1 + ks * ordered > cumulative).sum(-1, keepdim=True).clamp_min(1)  # (..., 1): the top score always qualifies
    tau = (cumulative.gather(-1, support - 1) - 1) / support.to(scores.dtype)  # (..., 1)
    return (scores - tau).clamp_min(0.0)


def entmax15(scores: Tensor) -> Tensor:
    """1.5-entmax along the last axis: max(z/2 - tau, 0)^2 with sum 1 (Peters et al. 2019, the exact sort-based algorithm)."""
    half = scores / 2
    half = half - half.amax(-1, keepdim=True)
    ordered = half.sort(dim=-1, descending=True).values  # (..., L)
    ks = torch.arange(1, scores.shape[-1] + 1, device=scores.device, dtype=scores.dtype)
    mean = ordered.cumsum(-1) / ks
    mean_square = ordered.square().cumsum(-1) / ks
    spread = ks * (mean_square - mean.square())
    taus = mean - ((1 - spread) / ks).clamp_min(0.0).sqrt()  # (..., L): tau if the support were the top k
    support = (taus <= ordered).sum(-1, keepdim=True).clamp_min(1)  # (..., 1): the top score always qualifies
    tau = taus.gather(-1, support - 1)
    return (half - tau).clamp_min(0.0).square()


SOFTMAX = "softmax"
# Every normaliser by its config name (decoder.normaliser): adding one is its function above and one entry here
# (and, if it gives exactly 0 to any score 4 below the best, one in ZERO_FAR_BELOW).
NORMALISERS = {SOFTMAX: lambda scores: torch.softmax(scores, dim=-1), "sparsemax": sparsemax, "entmax15": entmax15}
ZERO_FAR_BELOW = {"sparsemax", "entmax15"}  # the sort-based maps: masked positions are filled in 4 below the best


def normalise(scores: Tensor, mask: Tensor | None, normaliser: str) -> Tensor:
    """Weights over the last axis of ``scores`` (..., L) that sum to 1 over the positions where ``mask`` (broadcast
    to the scores) is True; the others get exactly 0. Computed in fp32 (a sort and cumulative sums in bf16 would
    lose the support), returned in the scores' dtype."""
    dtype, scores = scores.dtype, scores.float()
    if mask is None:
        return NORMALISERS[normaliser](scores).to(dtype)
    if normaliser not in ZERO_FAR_BELOW:  # softmax, and any map that weighs exp(score): -inf at a masked position is 0
        weights = NORMALISERS[normaliser](scores.masked_fill(~mask, float("-inf")))
        return (weights if normaliser == SOFTMAX else weights.masked_fill(~mask, 0.0)).to(dtype)
    # Both sparse maps give exactly 0 to a score 4 below the best: sparsemax's tau is at least the best score minus 1,
    # entmax15's at least half the best minus 1 (its scores are halved), so a masked position filled in there gets 0
    # and leaves the real positions' weights as if it were not there; a finite fill keeps the sorts and sums free of
    # inf - inf.
    best = scores.masked_fill(~mask, float("-inf")).amax(-1, keepdim=True)  # (..., 1)
    weights = NORMALISERS[normaliser](torch.where(mask, scores, best - 4.0))
    return weights.masked_fill(~mask, 0.0).to(dtype)


class AttentionScore(nn.Module):
    """Unnormalised alignment scores between decoder queries and memory."""

    equal_sizes = False  # True: the query and the memory vectors must have one size (Q == D)

    def prepare_keys(self, memory: Tensor) -> Tensor:
        """Per-batch projection of memory (B, L, D) -> keys (B, L, K)."""
        return memory

    def forward(self, query: Tensor, keys: Tensor) -> Tensor:  # (B, T, Q), (B, L, K) -> (B, T, L)
        raise NotImplementedError


class DotScore(AttentionScore):
    equal_sizes = True

    def __init__(self, query_size: int, memory_size: int, attention_size: int):
        super().__init__()

    def forward(self, query: Tensor, keys: Tensor) -> Tensor:
        return torch.bmm(query, keys.transpose(1, 2))  # (B, T, L)


class ScaledDotScore(DotScore):
    def __init__(self, query_size: int, memory_size: int, attention_size: int):
        super().__init__(query_size, memory_size, attention_size)
        self.scale = 1.0 / math.sqrt(memory_size)

    def forward(self, query: Tensor, keys: Tensor) -> Tensor:
        return super().forward(query, keys) * self.scale


class GeneralScore(DotScore):
    equal_sizes = False

    def __init__(self, query_size: int, memory_size: int, attention_size: int):
        super().__init__(query_size, memory_size, attention_size)
        self.memory_projection = nn.Linear(memory_size, query_size, bias=False)  # W

    def prepare_keys(self, memory: Tensor) -> Tensor:
        return self.memory_projection(memory)  # (B, L, Q)


class _TanhEnergy(AttentionScore):
    """v^T tanh(query part + key part), shared by ``concat`` and ``additive``."""

    energy: nn.Linear  # A -> 1

    def _query_part(self, query: Tensor) -> Tensor:
        raise NotImplementedError

    def forward(self, query: Tensor, keys: Tensor) -> Tensor:
        hidden = torch.tanh(self._query_part(query).unsqueeze(2) + keys.unsqueeze(1))  # (B, T, L, A)
        return self.energy(hidden).squeeze(-1)  # (B, T, L)


class ConcatScore(_TanhEnergy):
    """Luong's ``concat``: one linear layer over [h; s], applied in two halves for speed."""

    def __init__(self, query_size: int, memory_size: int, attention_size: int):
        super().__init__()
        self.query_size = query_size
        self.combine = nn.Linear(query_size + memory_size, attention_size)  # W, b over [h; s]
        self.energy = nn.Linear(attention_size, 1, bias=False)  # v

    def prepare_keys(self, memory: Tensor) -> Tensor:
        return memory @ self.combine.weight[:, self.query_size :].t()  # (B, L, A)

    def _query_part(self, query: Tensor) -> Tensor:
        return nn.functional.linear(query, self.combine.weight[:, : self.query_size], self.combine.bias)  # (B, T, A)


class AdditiveScore(_TanhEnergy):
    """Bahdanau's score (also Show-Attend-Tell's): separate key and query projections."""

    def __init__(self, query_size: int, memory_size: int, attention_size: int):
        super().__init__()
        self.key_layer = nn.Linear(memory_size, attention_size, bias=False)  # W1
        self.query_layer = nn.Linear(query_size, attention_size)  # W2, b
        self.energy = nn.Linear(attention_size, 1, bias=False)  # v

    def prepare_keys(self, memory: Tensor) -> Tensor:
        return self.key_layer(memory)  # (B, L, A)

    def _query_part(self, query: Tensor) -> Tensor:
        return self.query_layer(query)  # (B, T, A)


class UniformScore(AttentionScore):
    """No attention, the ablation baseline: equal scores, so every real position weighs the same
    and the context is the mean of the memory (for an image, the mean grid vector)."""

    def __init__(self, query_size: int, memory_size: int, attention_size: int):
        super().__init__()

    def forward(self, query: Tensor, keys: Tensor) -> Tensor:
        return query.new_zeros(query.shape[0], query.shape[1], keys.shape[1])  # (B, T, L)


NO_ATTENTION = "none"
# Every score by its config name (decoder.score): adding a score is its class above and one entry here.
SCORE_FUNCTIONS: dict[str, type[AttentionScore]] = {
    "dot": DotScore,
    "general": GeneralScore,
    "concat": ConcatScore,
    "additive": AdditiveScore,
    "scaled_dot": ScaledDotScore,
    NO_ATTENTION: UniformScore,  # a score name too, but not an attention model
}
SCORES = tuple(name for name in SCORE_FUNCTIONS if name != NO_ATTENTION)  # the attention models
SIZED_SCORES = tuple(name for name, score in SCORE_FUNCTIONS.items() if issubclass(score, _TanhEnergy))  # those with a hidden layer of decoder.attention_size


def build_score(name: str, query_size: int, memory_size: int, attention_size: int) -> AttentionScore:
    """The score function called ``name`` (a valid config name); sizes are checked here, not at the first batch."""
    score = SCORE_FUNCTIONS[name]
    if score.equal_sizes and query_size != memory_size:
        raise UserError(
            f"attention score '{name}' needs the decoder hidden size ({query_size}) to equal the "
            f"encoder memory size ({memory_size}); use 'general', 'concat' or 'additive', or change the sizes"
        )
    return score(query_size, memory_size, attention_size)


class Attention(nn.Module):
    """Scores, the masked normaliser (softmax unless told) and the weighted sum of memory."""

    compiled_whole = True  # train.compile: an RNN decoder runs it once a step (attnkit.train.compile_layers)

    def __init__(self, score: str, query_size: int, memory_size: int, attention_size: int, normaliser: str = SOFTMAX):
        super().__init__()
        self.score = build_score(score, query_size, memory_size, attention_size)
        self.normaliser = normaliser

    def prepare_keys(self, memory: Tensor) -> Tensor:
        return self.score.prepare_keys(memory)

    def forward(self, query: Tensor, keys: Tensor, memory: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """query (B, T, Q) -> context (B, T, D) and weights (B, T, L) that sum to 1 over real positions."""
        weights = normalise(self.score(query, keys), mask.unsqueeze(1), self.normaliser)  # (B, T, L)
        context = torch.bmm(weights, memory)  # (B, T, D)
        return context, weights


class MultiHeadAttention(nn.Module):
    """h heads of scaled dot-product attention, for self-attention and cross-attention alike.

    Legend: B rows, T queries, L keys, M model size, h heads, d = M / h per head, K beams per source.

    The key/value projection (:meth:`keys_values`) is separate from the attention (``forward``) so a
    decoder can project the encoder memory once per source and keep it, and append one step's keys to
    its self-attention cache. Weights are computed only when asked (``need_weights``) or when the normaliser
    is not softmax (sparsemax, entmax15); otherwise the fused ``scaled_dot_product_attention`` kernel runs and
    no (B, h, T, L) tensor is made. Both paths give the same output (a test checks it).
    """

    def __init__(self, model_size: int, heads: int, memory_size: int | None = None, dropout: float = 0.0, normaliser: str = SOFTMAX):
        super().__init__()
        if model_size % heads:
            raise ValueError(f"{heads} heads do not divide the model size {model_size}")
        self.heads, self.head_size = heads, model_size // heads
        self.dropout = dropout
        self.normaliser = normaliser  # anything but softmax runs the explicit path: the fused kernel only softmaxes
        self.query = nn.Linear(model_size, model_size)
        self.key_value = nn.Linear(memory_size or model_size, 2 * model_size)  # keys and values in one multiply
        self.output = nn.Linear(model_size, model_size)

    def keys_values(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """memory (B, L, D) -> keys and values (B, h, L, d) each."""
        batch, length, _ = memory.shape
        keys, values = self.key_value(memory).view(batch, length, 2, self.heads, self.head_size).permute(2, 0, 3, 1, 4).unbind(0)
        return keys, values

    def forward(
        self, query: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None, beams: int = 1, need_weights: bool = False, causal: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """query (B*K, T, M) over keys/values (B, h, L, d) -> output (B*K, T, M) and weights (B*K, h, T, L) or None.

        ``mask`` (B, T or 1, L) bool, True = may attend (None: everything). With ``beams`` K > 1 the K
        consecutive query rows of a source attend over its one copy of the keys, as K*T queries.
        ``causal`` (with no ``mask``, T == L): query t attends to keys 0 ... t only. Said as a flag rather than a
        mask so the fused kernel is told ``is_causal`` and can run its fastest (flash) variant.
        """
        rows, steps, size = query.shape
        if causal and mask is not None:
            raise ValueError("causal attention takes no mask of its own")
        grouped = self.query(query).view(rows // beams, beams * steps, self.heads, self.head_size).transpose(1, 2)  # (B, h, K*T, d)
        explicit = need_weights or self.normaliser != SOFTMAX
        if causal and explicit:  # the explicit path needs the mask itself
            mask = torch.ones(steps, keys.shape[2], dtype=torch.bool, device=query.device).tril().unsqueeze(0)  # (1, T, L)
            causal = False
        mask = None if mask is None else mask.unsqueeze(1)  # (B, 1, T or 1, L)
        dropout = self.dropout if self.training else 0.0
        weights = None
        if explicit:
            scores = grouped @ keys.transpose(-1, -2) / math.sqrt(self.head_size)  # (B, h, K*T, L)
            weights = normalise(scores, mask, self.normaliser).to(values.dtype)  # (B, h, K*T, L)
            attended = nn.functional.dropout(weights, dropout, self.training) @ values  # (B, h, K*T, d)
            weights = weights.view(rows // beams, self.heads, beams, steps, -1).transpose(1, 2).reshape(rows, self.heads, steps, -1)  # (B*K, h, T, L)
            if not need_weights:
                weights = None
        else:
            with fused_attention_backends(query.device):
                attended = nn.functional.scaled_dot_product_attention(grouped, keys, values, attn_mask=mask, dropout_p=dropout, is_causal=causal)  # (B, h, K*T, d)
        attended = attended.transpose(1, 2).reshape(rows, steps, size)  # (B*K, T, M): heads side by side again
        return self.output(attended), weights
