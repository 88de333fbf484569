"""The recurrent cells the text encoder and the RNN decoder are built from, by their config names
(``text_encoder.rnn``, ``decoder.rnn``): adding a cell is one entry here for the text encoder; the RNN decoder also
needs its one-step rule (``RNNDecoder._cell_step`` runs the fused LSTM and GRU kernels by name)."""

from torch import nn

CELLS: dict[str, type[nn.RNNBase]] = {"gru": nn.GRU, "lstm": nn.LSTM}
