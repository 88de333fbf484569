"""The recurrent cells the text encoder and the RNN decoder are built from, by their config names
(``text_encoder.rnn``, ``decoder.rnn``): adding a cell is one entry here."""

from torch import nn

CELLS: dict[str, type[nn.RNNBase]] = {"gru": nn.GRU, "lstm": nn.LSTM}
