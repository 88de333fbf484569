"""The Transformer decoder (Vaswani et al. 2017): masked self-attention, multi-head cross-attention over
the encoder memory, a feed-forward layer; N pre-norm layers (:mod:`attnkit.blocks`).

Legend: B sources, K beams per source, T target steps, t steps decoded so far, L memory length,
D memory size, M model size (decoder.hidden_size), h heads, d = M / h, N layers, V target vocabulary.

It honours the same contract as the RNN decoder (:class:`attnkit.interfaces.Decoder`), so search, the
trainer, the losses and the analysis use it unchanged:

* ``forward`` runs a whole teacher-forced target at once under a causal mask;
* ``step`` decodes one word for every row. Each layer's self-attention keys and values of the steps
  so far are kept in the state (the key/value cache), so a step projects only its own word and costs
  O(t), not the O(t^2) of running the prefix again; beam search reorders the cache like any state.
  The memory's cross-attention keys and values are projected once per source in ``init_state``.

"The" attention that losses, plots, statistics and ``--replace-unk`` read is a declared aggregate of
the cross-attention: the mean of one layer's heads, or one head (``decoder.attention_layer`` and
``decoder.attention_head``, stored with the model's config). ``forward(need_attention=True)`` also
returns every layer's and head's weights (B, N, h, T, L) for the analysis; without it no weights are
computed at all (the fused attention kernel runs).

Reading offset 1: step t's input is y_t = w_{t-1}, and every layer's self-attention reads it before
the layer's cross-attention asks its query, so step t's attention has read w_{t-1} (as Luong's).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from attnkit.attention import SOFTMAX, MultiHeadAttention
from attnkit.blocks import FeedForward, ScaledEmbedding, sinusoidal_positions, xavier_init
from attnkit.config import DecoderConfig
from attnkit.interfaces import DecoderOutput, EncoderOutput, StepOutput


@dataclass(frozen=True)
class TransformerState:
    """The key/value caches of a batch of hypotheses (``beams`` consecutive rows per source)."""

    self_keys: tuple[Tensor, ...]  # per layer (B*K, h, t, d): self-attention keys of the steps so far
    self_values: tuple[Tensor, ...]  # per layer (B*K, h, t, d)
    cross_keys: tuple[Tensor, ...]  # per layer (B, h, L, d): the memory, projected once per source
    cross_values: tuple[Tensor, ...]  # per layer (B, h, L, d)
    mask: Tensor  # (B, L) True = real memory position
    steps: int = 0  # t: words decoded so far (the next word's position)
    beams: int = 1

    def _rows(self, index: Tensor) -> dict[str, tuple[Tensor, ...]]:
        return dict(
            self_keys=tuple(k.index_select(0, index) for k in self.self_keys),
            self_values=tuple(v.index_select(0, index) for v in self.self_values),
        )

    def expand_beams(self, beams: int) -> "TransformerState":
        rows = torch.arange(self.self_keys[0].shape[0], device=self.mask.device).repeat_interleave(beams)  # (B*K,)
        return replace(self, **self._rows(rows), beams=self.beams * beams)

    def select_beams(self, rows: Tensor, sources: Tensor) -> "TransformerState":
        return replace(
            self,
            **self._rows(rows),
            cross_keys=tuple(k.index_select(0, sources) for k in self.cross_keys),
            cross_values=tuple(v.index_select(0, sources) for v in self.cross_values),
            mask=self.mask.index_select(0, sources),
        )


class TransformerDecoderLayer(nn.Module):
    compiled_whole = True  # train.compile (attnkit.train.compile_layers)

    def __init__(self, size: int, heads: int, feedforward_size: int, memory_size: int, dropout: float, normaliser: str = SOFTMAX):
        super().__init__()
        self.self_norm = nn.LayerNorm(size)
        self.self_attention = MultiHeadAttention(size, heads, dropout=dropout)
        self.cross_norm = nn.LayerNorm(size)
        self.cross_attention = MultiHeadAttention(size, heads, memory_size, dropout=dropout, normaliser=normaliser)
        self.feedforward_norm = nn.LayerNorm(size)
        self.feedforward = FeedForward(size, feedforward_size, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        past_keys: Tensor,
        past_values: Tensor,
        causal: bool,
        cross_keys: Tensor,
        cross_values: Tensor,
        memory_mask: Tensor,
        beams: int,
        need_weights: bool,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """x (B*K, T, M) after the ``t`` cached steps -> x, the keys and values of all t + T steps
        (B*K, h, t + T, d) each, and the cross-attention weights (B*K, h, T, L) when asked."""
        normed = self.self_norm(x)
        new_keys, new_values = self.self_attention.keys_values(normed)  # (B*K, h, T, d) each
        keys, values = torch.cat([past_keys, new_keys], 2), torch.cat([past_values, new_values], 2)  # (B*K, h, t+T, d)
        attended, _ = self.self_attention(normed, keys, values, None, causal=causal)  # (B*K, T, M); its own row's cache: beams 1
        x = x + self.dropout(attended)
        context, weights = self.cross_attention(
            self.cross_norm(x), cross_keys, cross_values, memory_mask.unsqueeze(1), beams, need_weights
        )  # (B*K, T, M), (B*K, h, T, L) | None
        x = x + self.dropout(context)
        x = x + self.dropout(self.feedforward(self.feedforward_norm(x)))
        return x, keys, values, weights


class TransformerDecoder(nn.Module):
    """The ``transformer`` decoder family."""

    reading_offset = 1  # see the module docstring
    trains_step_by_step = False  # every target step at once (causal self-attention)

    def __init__(self, config: DecoderConfig, vocab_size: int, memory_size: int, init_size: int, pad_index: int = 0):
        super().__init__()  # init_size: a Transformer starts from no state; the memory is all it reads
        self.config = config
        size = config.hidden_size
        self.size, self.heads = size, config.heads
        self.embedding = ScaledEmbedding(vocab_size, size, pad_index)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(
            TransformerDecoderLayer(size, config.heads, config.feedforward_size, memory_size, config.dropout, config.normaliser) for _ in range(config.num_layers)
        )
        self.final_norm = nn.LayerNorm(size)
        self.output = nn.Linear(size, vocab_size)
        xavier_init(self)  # the linear layers; the embedding keeps its own initialisation
        if config.tie_embeddings:
            self.output.weight = self.embedding.weight
        self.attention_layer = config.attention_layer % config.num_layers  # the declared aggregate (module docstring)
        self.attention_head = config.attention_head

    def _aggregate(self, weights: Tensor) -> Tensor:
        """One layer's cross-attention (B, h, T, L) -> the declared aggregate (B, T, L)."""
        return weights.mean(1) if self.attention_head < 0 else weights[:, self.attention_head]

    def _embed(self, inputs: Tensor, start: int) -> Tensor:
        """Token ids (B, T) at positions start ... -> scaled embeddings plus position codes (B, T, M)."""
        embedded = self.embedding(inputs)
        return self.dropout(embedded + sinusoidal_positions(inputs.shape[1], self.size, inputs.device, start).to(embedded.dtype))

    def _empty_cache(self, rows: int, like: Tensor) -> Tensor:
        return like.new_zeros(rows, self.heads, 0, self.size // self.heads)  # (B, h, 0, d)

    # -- state ---------------------------------------------------------------------------------
    def init_state(self, encoded: EncoderOutput) -> TransformerState:
        cross = [layer.cross_attention.keys_values(encoded.memory) for layer in self.layers]  # per layer (B, h, L, d) x 2
        empty = self._empty_cache(encoded.batch_size, encoded.memory)
        return TransformerState(
            self_keys=(empty,) * len(self.layers),
            self_values=(empty,) * len(self.layers),
            cross_keys=tuple(keys for keys, _ in cross),
            cross_values=tuple(values for _, values in cross),
            mask=encoded.mask,
        )

    def _layers(self, x: Tensor, state: TransformerState, causal: bool, weights_of: set[int]):
        """Every layer over x (B*K, T, M) after ``state``'s cached steps -> x, the new caches, the weights of ``weights_of``."""
        keys, values, weights = [], [], {}
        for i, layer in enumerate(self.layers):
            x, k, v, w = layer(
                x, state.self_keys[i], state.self_values[i], causal, state.cross_keys[i], state.cross_values[i], state.mask, state.beams, i in weights_of
            )
            keys.append(k)
            values.append(v)
            if w is not None:
                weights[i] = w
        return self.final_norm(x), tuple(keys), tuple(values), weights

    # -- one step, shared by search and the analysis ------------------------------------------------
    def step(self, previous: Tensor, state: TransformerState) -> StepOutput:
        """Advance by one target word: ``previous`` (B*K,) token ids -> logits over the next word."""
        x = self._embed(previous.unsqueeze(1), start=state.steps)  # (B*K, 1, M)
        x, keys, values, weights = self._layers(x, state, False, {self.attention_layer})  # the cache holds only the past: nothing to hide
        logits = self.output(self.dropout(x)).squeeze(1)  # (B*K, V)
        attention = self._aggregate(weights[self.attention_layer]).squeeze(1)  # (B*K, L)
        return StepOutput(logits, attention, replace(state, self_keys=keys, self_values=values, steps=state.steps + 1))

    # -- teacher-forced pass ---------------------------------------------------------------------------
    @torch.no_grad()
    def value_vectors(self, encoded: EncoderOutput) -> Tensor:
        """What each memory position adds to each layer's cross-attention output through each head: its value
        vector times the head's slice of the output projection, f_h(m) = (W_V^h m + b_V^h) W_O^h (Kobayashi et al.
        2020; the output bias is added once, after the sum). (B, N, h, L, M)"""
        every = []
        for layer in self.layers:
            attention = layer.cross_attention
            _, values = attention.keys_values(encoded.memory)  # (B, h, L, d)
            projection = attention.output.weight.view(-1, attention.heads, attention.head_size)  # (M, h, d)
            every.append(torch.einsum("bhld,mhd->bhlm", values, projection))  # (B, h, L, M)
        return torch.stack(every, 1)  # (B, N, h, L, M)

    def forward(self, encoded: EncoderOutput, inputs: Tensor, teacher_forcing: float = 1.0, need_attention: bool = True) -> DecoderOutput:
        """All T steps of ``inputs`` (B, T) (<bos> w1 ... w_{T-1}) at once; logits predict w1 ... <eos>.

        Right padding needs no mask of its own: under the causal mask a real position never sees a later one.
        """
        if teacher_forcing < 1.0:
            raise ValueError("the transformer decoder trains on the gold prefix only (scheduled sampling is an rnn option)")
        x = self._embed(inputs, start=0)  # (B, T, M)
        wanted = set(range(len(self.layers))) if need_attention else set()
        x, _, _, weights = self._layers(x, self.init_state(encoded), True, wanted)  # causal self-attention: the empty cache, T == L
        logits = self.output(self.dropout(x))  # (B, T, V)
        if not need_attention:
            return DecoderOutput(logits, None, encoded.mask)
        heads = torch.stack([weights[i] for i in range(len(self.layers))], 1)  # (B, N, h, T, L)
        return DecoderOutput(logits, self._aggregate(heads[:, self.attention_layer]), encoded.mask, heads)


# -- the same decoder without its cache, for tests and benchmarks -------------------------------------------------
@dataclass(frozen=True)
class PrefixState:
    """Every row's whole prefix, decoded again at every step."""

    encoded: EncoderOutput  # one row per source
    prefix: Tensor  # (B*K, t) the words read so far
    beams: int = 1

    @property
    def mask(self) -> Tensor:
        return self.encoded.mask  # (B, L)

    def expand_beams(self, beams: int) -> "PrefixState":
        return replace(self, prefix=self.prefix.repeat_interleave(beams, 0), beams=self.beams * beams)

    def select_beams(self, rows: Tensor, sources: Tensor) -> "PrefixState":
        e = self.encoded
        kept = EncoderOutput(e.memory.index_select(0, sources), e.mask.index_select(0, sources), e.init_state.index_select(0, sources), e.layout)
        return replace(self, encoded=kept, prefix=self.prefix.index_select(0, rows))


class RecomputingDecoder:
    """A decoder's ``step`` without a key/value cache: each step runs the teacher-forced pass over the whole
    prefix (O(t^2) per output) and keeps its last position. What the cache must equal (tests), and what it
    saves (``bench/beam_speed.py --no-cache``)."""

    def __init__(self, decoder: TransformerDecoder):
        self.decoder = decoder
        self.reading_offset = decoder.reading_offset

    def init_state(self, encoded: EncoderOutput) -> PrefixState:
        return PrefixState(encoded, encoded.mask.new_zeros(encoded.batch_size, 0, dtype=torch.long))

    def step(self, previous: Tensor, state: PrefixState) -> StepOutput:
        prefix = torch.cat([state.prefix, previous.unsqueeze(1)], 1)  # (B*K, t + 1)
        e, k = state.encoded, state.beams
        rows = EncoderOutput(e.memory.repeat_interleave(k, 0), e.mask.repeat_interleave(k, 0), e.init_state.repeat_interleave(k, 0), e.layout)
        output = self.decoder(rows, prefix)
        return StepOutput(output.logits[:, -1], output.attention[:, -1], replace(state, prefix=prefix))
