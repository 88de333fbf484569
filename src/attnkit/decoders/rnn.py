"""The RNN attention decoder (Bahdanau and Luong styles), shared by every modality.

Legend: B batch, T target steps, L memory length, D memory size, E embedding
size, H decoder hidden size, R readout size (the vector fed to the output
layer), V target vocabulary, N RNN layers.

Two styles, one :meth:`RNNDecoder.step`:

* ``bahdanau`` (Bahdanau et al. 2015; Xu et al. 2015): attend with the previous
  top-layer state, feed [embedding; context] to the RNN, read out
  tanh(W [h; c; e]). Optional Show-Attend-Tell gate beta = sigmoid(w . s) scales
  the context.
* ``luong`` (Luong et al. 2015): run the RNN first, attend with the new state,
  attentional vector tanh(W_c [c; h]). Optional input feeding concatenates the
  previous attentional vector to the next RNN input.

Training and search share ``step``. Teacher-forced ``forward`` runs the whole
sequence through the RNN at once when that is equivalent (Luong without input
feeding); otherwise it runs the same per-step code up to the readout and the
output layer once over all steps. ``tests/test_decoder.py`` proves both equal
the step loop.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from attnkit.attention import Attention
from attnkit.cells import CELLS
from attnkit.config import DecoderConfig
from attnkit.interfaces import DecoderOutput, EncoderOutput, StepOutput
from attnkit.precision import to_fp32, without_autocast

# The choices of decoder.style (see above), each with its reading offset: how many steps after the step that
# emits a word the style's attention query has read that word (attnkit.analysis.word_attention). Step t reads
# input y_t (y_0 = <bos>, y_t = w_{t-1}) and emits w_t, so w_j is the input of step j + 1:
# * luong runs the RNN on its input first and attends with the new state: step j + 1's query has read w_j (1);
# * bahdanau attends with the previous state, made by the step before from its input: step j + 2 (2).
STYLES = {"luong": 1, "bahdanau": 2}
INITS = ("bridge", "zeros")  # decoder.init: the first state from tanh(W init_state), or zeros


@dataclass(frozen=True)
class RNNState:
    """Everything that changes per batch, so beam search can reorder one object.

    Projected attention keys live here rather than on the module: a module-level
    cache would go stale when beam search reorders or shrinks the batch.

    Rows are hypotheses, ``beams`` consecutive rows per source (1 outside beam
    search). ``keys``, ``memory`` and ``mask`` are kept once per source, so the
    beams of a source attend over one copy of it and reordering beams moves only
    the small per-row tensors.
    """

    hidden: Tensor  # (N, B*K, H)
    cell: Tensor | None  # (N, B*K, H) for LSTM, else None
    feed: Tensor | None  # (B*K, R) previous attentional vector (Luong input feeding), else None
    keys: Tensor  # (B, L, A) memory projected by the score function
    memory: Tensor  # (B, L, D)
    mask: Tensor  # (B, L) True = real position
    beams: int = 1  # K: rows per source

    def _rows(self, index: Tensor) -> dict[str, Tensor | None]:
        return dict(
            hidden=self.hidden.index_select(1, index),
            cell=None if self.cell is None else self.cell.index_select(1, index),
            feed=None if self.feed is None else self.feed.index_select(0, index),
        )

    def expand_beams(self, beams: int) -> "RNNState":
        """K copies of every row, for a beam search of width K over each source."""
        rows = torch.arange(self.hidden.shape[1], device=self.hidden.device).repeat_interleave(beams)  # (B*K,)
        return replace(self, **self._rows(rows), beams=self.beams * beams)

    def select_beams(self, rows: Tensor, sources: Tensor) -> "RNNState":
        """Keep ``sources`` (S',) and, for them, the rows ``rows`` (S'*K,): each group of K new rows
        must come from the matching kept source (beam search picks the parents of its survivors)."""
        per_source = dict(keys=self.keys.index_select(0, sources), memory=self.memory.index_select(0, sources), mask=self.mask.index_select(0, sources))
        return replace(self, **self._rows(rows), **per_source)


STEPPED_CELLS = ("gru", "lstm")  # the cells _cell_step runs one step of, each by its fused kernel


class RNNDecoder(nn.Module):
    """The ``rnn`` decoder family: one RNN, one attention, the styles above."""

    trains_step_by_step = True  # its training loop runs once per target step: padded target columns cost it steps
    compiled_methods = ("_cell_step",)  # train.compile: the fused cells of one step (attnkit.train.compile_layers)

    def __init__(self, config: DecoderConfig, vocab_size: int, memory_size: int, init_size: int, pad_index: int = 0):
        super().__init__()
        self.config = config
        hidden, embedding = config.hidden_size, config.embedding_size
        self.readout_size = embedding if config.tie_embeddings else (config.readout_size or hidden)
        if config.rnn not in STEPPED_CELLS:  # a cell added to cells.CELLS alone would train, then fail at its first step
            raise ValueError(f"the RNN decoder steps {' and '.join(STEPPED_CELLS)} cells only (RNNDecoder._cell_step), not {config.rnn!r}")
        self.is_lstm = config.rnn == "lstm"
        self.reading_offset = STYLES[config.style]  # see STYLES
        self.feeds_input = config.style == "luong" and config.input_feeding

        self.embedding = nn.Embedding(vocab_size, embedding, padding_idx=pad_index)
        self.dropout = nn.Dropout(config.dropout)
        rnn_input = embedding + (memory_size if config.style == "bahdanau" else 0) + (self.readout_size if self.feeds_input else 0)
        self.rnn = CELLS[config.rnn](
            rnn_input,
            hidden,
            num_layers=config.num_layers,
            batch_first=True,
            dropout=config.dropout if config.num_layers > 1 else 0.0,
        )
        self.attention = Attention(config.score, hidden, memory_size, config.attention_size, config.normaliser)
        self.context_gate = nn.Linear(hidden, 1) if config.context_gate else None  # beta = sigmoid(w . s + b)
        readout_input = hidden + memory_size + (embedding if config.style == "bahdanau" else 0)
        self.readout = nn.Linear(readout_input, self.readout_size)  # W_c over [h; c] (+ e for bahdanau)
        self.output = nn.Linear(self.readout_size, vocab_size)
        if config.tie_embeddings:
            self.output.weight = self.embedding.weight
        if config.init == "bridge":
            self.bridge = nn.Linear(init_size, config.num_layers * hidden)
            self.cell_bridge = nn.Linear(init_size, config.num_layers * hidden) if self.is_lstm else None

    # -- state ---------------------------------------------------------------------------------
    def init_state(self, encoded: EncoderOutput) -> RNNState:
        batch = encoded.batch_size
        layers, hidden = self.config.num_layers, self.config.hidden_size

        def start(bridge: nn.Linear | None) -> Tensor:
            if bridge is None:
                return encoded.memory.new_zeros(layers, batch, hidden)
            flat = torch.tanh(bridge(encoded.init_state))  # (B, N*H)
            return torch.stack(flat.view(batch, layers, hidden).unbind(1))  # (N, B, H), strided as the states the cell step stacks (one compiled variant)

        bridged = self.config.init == "bridge"
        return RNNState(
            hidden=start(self.bridge if bridged else None),
            cell=start(self.cell_bridge if bridged else None) if self.is_lstm else None,
            feed=encoded.memory.new_zeros(batch, self.readout_size) if self.feeds_input else None,
            keys=self.attention.prepare_keys(encoded.memory),
            memory=encoded.memory,
            mask=encoded.mask,
        )

    # -- one step, shared by training and search -----------------------------------------------------
    def step(self, previous: Tensor, state: RNNState) -> StepOutput:
        """Advance by one target word: ``previous`` (B,) token ids -> logits over the next word."""
        embedded = self.dropout(self.embedding(previous)).unsqueeze(1)  # (B, 1, E)
        readout, attention, state = self._advance(embedded, state)
        return StepOutput(self._logits(readout).squeeze(1), attention.squeeze(1), state)

    def _advance(self, embedded: Tensor, state: RNNState) -> tuple[Tensor, Tensor, RNNState]:
        """Run T steps up to the readout (T == 1 unless the caller proved the steps independent of attention)."""
        hx = (state.hidden, state.cell) if self.is_lstm else state.hidden
        if self.config.style == "bahdanau":
            query = state.hidden[-1].unsqueeze(1)  # (B, 1, H) previous top-layer state
            context, attention = self._attend(query, state)  # (B, 1, D), (B, 1, L)
            outputs, hx = self._run_rnn(torch.cat([embedded, context], dim=-1), hx)  # (B, 1, H)
            readout = torch.tanh(self.readout(torch.cat([outputs, context, embedded], dim=-1)))  # (B, 1, R)
        else:
            rnn_input = torch.cat([embedded, state.feed.unsqueeze(1)], dim=-1) if self.feeds_input else embedded
            outputs, hx = self._run_rnn(rnn_input, hx)  # (B, T, H)
            context, attention = self._attend(outputs, state)  # (B, T, D), (B, T, L)
            readout = torch.tanh(self.readout(torch.cat([outputs, context], dim=-1)))  # (B, T, R)
        hidden, cell = hx if self.is_lstm else (hx, None)
        feed = readout[:, -1] if self.feeds_input else None
        return readout, attention, replace(state, hidden=hidden, cell=cell, feed=feed)

    def _logits(self, readout: Tensor) -> Tensor:
        return self.output(self.dropout(readout))  # (B, T, V)

    def _run_rnn(self, inputs: Tensor, hx):
        """The RNN over ``inputs`` (B, T, I) from ``hx`` -> outputs (B, T, H) and the new ``hx``.

        A single step goes layer by layer through the fused cell kernels with the RNN
        module's own weights: on CPU, nn.LSTM called on one step at a time takes about
        1.7x as long (it dispatches to oneDNN's sequence kernel). Several steps go
        through the module. Either way in fp32, outside autocast (:mod:`attnkit.precision`):
        the state it returns is fp32 too.
        """
        inputs, hx = to_fp32(inputs), to_fp32(hx)
        with without_autocast():
            if inputs.shape[1] != 1:
                return self.rnn(inputs, hx)
            return self._cell_step(inputs[:, 0], hx, self._layer_weights(), self.rnn.dropout)

    def _layer_weights(self) -> list[list[Tensor]]:
        """Each layer's [weight_ih, weight_hh, bias_ih, bias_hh], the RNN module's own. Read here, outside
        ``_cell_step``: torch.compile does not trace into an nn.LSTM or nn.GRU, and a compiled ``_cell_step`` that
        touched one would run eager (train.compile; a test checks the step compiles whole)."""
        names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        return [[getattr(self.rnn, f"{name}_l{layer}") for name in names] for layer in range(self.rnn.num_layers)]

    def _cell_step(self, layer_input: Tensor, hx, layer_weights: list[list[Tensor]], dropout: float):
        """One step (B, I) through every layer's fused cell kernel -> outputs (B, 1, H) and the new ``hx``;
        ``dropout`` between layers, as nn.LSTM's."""
        hidden, cell = hx if self.is_lstm else (hx, None)
        hiddens, cells = [], []
        for layer, weights in enumerate(layer_weights):
            if self.is_lstm:
                h, c = torch.lstm_cell(layer_input, (hidden[layer], cell[layer]), *weights)  # (B, H) each
                cells.append(c)
            else:
                h = torch.gru_cell(layer_input, hidden[layer], *weights)  # (B, H)
            hiddens.append(h)
            last = layer == len(layer_weights) - 1
            layer_input = h if last else nn.functional.dropout(h, dropout, self.training)  # as nn.LSTM between layers
        new_hidden = torch.stack(hiddens)  # (N, B, H)
        return h.unsqueeze(1), ((new_hidden, torch.stack(cells)) if self.is_lstm else new_hidden)

    def _attend(self, query: Tensor, state: RNNState) -> tuple[Tensor, Tensor]:
        """query (B*K, T, H) -> context (B*K, T, D), weights (B*K, T, L); the K beams of a source attend as K*T queries."""
        rows, steps, _ = query.shape
        grouped = query.reshape(rows // state.beams, state.beams * steps, -1)  # (B, K*T, H)
        context, attention = self.attention(grouped, state.keys, state.memory, state.mask)  # (B, K*T, D), (B, K*T, L)
        context, attention = context.reshape(rows, steps, -1), attention.reshape(rows, steps, -1)  # (B*K, T, D), (B*K, T, L)
        if self.context_gate is not None:
            context = torch.sigmoid(self.context_gate(query)) * context  # (B*K, T, D)
        return context, attention

    # -- teacher-forced unroll ---------------------------------------------------------------------
    @property
    def unrolls_in_parallel(self) -> bool:
        """True when the RNN input never depends on attention, so all T steps can run at once."""
        return self.config.style == "luong" and not self.feeds_input

    def value_vectors(self, encoded: EncoderOutput) -> Tensor:
        """What each memory position adds to the context, as one layer and one head: the memory itself (the context
        is the attention-weighted sum of the memory; norm-weighted attention reads its norms). (B, 1, 1, L, D)"""
        return encoded.memory[:, None, None]

    def forward(self, encoded: EncoderOutput, inputs: Tensor, teacher_forcing: float = 1.0, need_attention: bool = True) -> DecoderOutput:
        """Unroll over ``inputs`` (B, T) (<bos> w1 ... w_{T-1}); logits predict w1 ... <eos>.

        The attention is always returned (``need_attention`` is for the contract: an RNN step computes it anyway).

        With ``teacher_forcing`` < 1, each step after the first feeds the model's own
        previous prediction instead of the gold word with probability 1 - teacher_forcing
        (scheduled sampling, Bengio et al. 2015), drawn per sentence.
        """
        state = self.init_state(encoded)
        if teacher_forcing >= 1.0:
            embedded = self.dropout(self.embedding(inputs))  # (B, T, E)
            if self.unrolls_in_parallel:
                readout, attention, _ = self._advance(embedded, state)
                return DecoderOutput(self._logits(readout), attention, encoded.mask)
            # Step by step up to the readout, then the output layer once over all steps:
            # the same arithmetic as ``step``, but the largest matrix multiply runs as one.
            readouts, attention = [], []
            for t in range(inputs.shape[1]):
                readout, weights, state = self._advance(embedded[:, t : t + 1], state)
                readouts.append(readout)
                attention.append(weights)
            return DecoderOutput(self._logits(torch.cat(readouts, 1)), torch.cat(attention, 1), encoded.mask)  # (B, T, V), (B, T, L)
        logits, attention = [], []
        previous = inputs[:, 0]
        for t in range(inputs.shape[1]):
            out = self.step(previous, state)
            state = out.state
            logits.append(out.logits)
            attention.append(out.attention)
            if t + 1 < inputs.shape[1]:
                previous = inputs[:, t + 1]
                own = out.logits.argmax(-1)  # (B,)
                use_gold = torch.rand(previous.shape, device=previous.device) < teacher_forcing
                previous = torch.where(use_gold, previous, own)
        return DecoderOutput(torch.stack(logits, 1), torch.stack(attention, 1), encoded.mask)  # (B, T, V), (B, T, L)

