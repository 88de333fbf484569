"""attnkit.host_reads.HostReads finds, on a CPU, the places where code reads a tensor's values on the host (each a
host synchronisation on a GPU): every kind it names, once each, where the code made it; and nothing for work that
stays on the device, or for the batch sizes torch's recurrent layers keep on the host by design."""

import pytest
import torch

from attnkit.host_reads import HostReads

HERE = "tests/test_host_reads.py"
values = torch.tensor([1.0, 2.0, 3.0])


@pytest.mark.parametrize(
    "read, what",
    [
        (lambda: values[0].item(), "item"),
        (lambda: bool(values[0] > 0), "__bool__"),
        (lambda: int(values[0]), "__int__"),
        (lambda: float(values[0]), "__float__"),
        (lambda: range(10)[torch.tensor(3)], "__index__"),
        (lambda: values.tolist(), "tolist"),
        (lambda: values.numpy(), "numpy"),
        (lambda: values.cpu(), "cpu"),
        (lambda: values[values > 1], "index with a boolean mask"),
        (lambda: values.nonzero(), "nonzero"),
        (lambda: values.masked_select(values > 1), "masked_select"),
        (lambda: torch.unique(values), "_unique2"),
        (lambda: values.repeat_interleave(torch.tensor([1, 2, 1])), "repeat_interleave without output_size"),
    ],
)
def test_each_kind_of_read_is_found_once_where_it_is_made(read, what):
    with HostReads() as found:
        read()
    assert len(found.reads) == 1 and found.reads[0].startswith(f"{what} at {HERE}:"), found.reads  # item's own operator is not a second read


def test_work_that_stays_on_the_device_reads_nothing():
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(layer.parameters(), fused=True)
    with HostReads() as found:
        scaled = (values * 2).sum() / values.max()
        masked = values.masked_fill(values > 1, 0.0) + torch.where(values > 2, values, -values)
        repeated = values.repeat_interleave(torch.tensor([1, 2, 1]), output_size=4)  # its size told, not read
        picked = values[torch.tensor([2, 0, 1])] + len(values) + values.shape[0]
        loss = layer(torch.stack([masked, picked, repeated[:3]])).square().mean() + scaled
        loss.backward()
        torch.nn.utils.clip_grad_norm_(layer.parameters(), 1.0)
        optimizer.step()
    assert found.reads == []


def test_the_rnn_text_encoder_reads_nothing_back_and_torch_s_own_unpacking_would():
    """The bi-GRU recipe's one host synchronisation per step on the H200 (2026-11-26) was torch's unpacking: it
    copied the batch order to the host. The encoder now unpacks without it; torch's recurrent layer still reads the
    packed sequence's batch sizes, which PackedSequence keeps on the host by design, and those are not counted."""
    from torch.nn.utils.rnn import pad_packed_sequence

    from attnkit.config import TextEncoderConfig
    from attnkit.data.batching import pad_sequences
    from attnkit.encoders.text import TextEncoder, pack_from_host_lengths

    encoder = TextEncoder(TextEncoderConfig(rnn="gru", embedding_size=6, hidden_size=5, dropout=0.0), 12)
    tokens = pad_sequences([[4, 5], [6, 7, 8, 9], [10], [4, 4, 4]])
    with HostReads() as found:
        encoder(tokens).memory.sum().backward()
    assert found.reads == []

    outputs, _ = encoder.rnn(pack_from_host_lengths(encoder.embedding(tokens.ids), tokens.host_lengths))
    with HostReads() as found:
        pad_packed_sequence(outputs, batch_first=True)
    assert [read.split(":")[0] for read in found.reads] == ["cpu at torch/nn/utils/rnn.py"]
