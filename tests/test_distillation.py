"""Importance distillation (attnkit.distillation): the batched estimator equals the checked one, and the loss term."""

import pytest
import torch
from torch import nn

from attnkit.config import load_config
from attnkit.data.batching import Batch, pad_sequences
from attnkit.distillation import DISTILLED_WINDOWS, distilled_rows, window_removals, window_removals_on, windows_hidden_from_attention
from attnkit.errors import UserError
from attnkit.importance import CHOSEN, DEFAULT_HIDING, DEFAULT_WINDOWS, HideableSource, ImportanceSettings, importance_maps
from attnkit.interfaces import EncoderOutput, Grid, GridFeatures
from attnkit.losses import Seq2SeqObjective, supervision_loss
from conftest import TINY_TRANSFORMER, tiny_model

GRID = (3, 3)


class GridModel(nn.Module):
    """A tiny decoder over a 3 x 3 grid memory: each cell's features projected to the decoder's memory size (an
    image encoder in miniature, without a backbone)."""

    def __init__(self, vocab, **decoder):
        super().__init__()
        text_model = tiny_model(vocab, **decoder)
        self.decoder = text_model.decoder
        self.project = nn.Linear(4, text_model.encoder_for("text").output_size)

    def encode(self, source: GridFeatures) -> EncoderOutput:
        memory = self.project(source.features.flatten(2).transpose(1, 2))  # (B, 4, 3, 3) -> (B, 9, D)
        rows = memory.shape[0]
        return EncoderOutput(memory, torch.ones(rows, 9, dtype=torch.bool), memory.mean(1), Grid(*GRID))

    def forward(self, batch: Batch, teacher_forcing: float = 1.0, need_attention: bool = True):
        return self.decoder(self.encode(batch.source), batch.target[:, :-1], teacher_forcing, need_attention)


def _batch() -> Batch:
    torch.manual_seed(3)
    targets = pad_sequences([[2, 5, 9, 6, 3], [2, 7, 3], [2, 4, 4, 8, 10, 3]]).ids  # <bos> ... <eos>, padded
    return Batch(GridFeatures(torch.randn(3, 4, *GRID)), targets, torch.arange(3))


def test_windows_cover_each_cell_as_captums_occlusion_averages_them():
    hidden, weights = window_removals(GRID, (1, 2))
    assert hidden.shape == (9 + 4, 9)  # nine 1 x 1 windows, four 2 x 2
    assert hidden[9].view(GRID).tolist() == [[True, True, False], [True, True, False], [False, False, False]]
    # Per size, a cell's weights over the windows covering it sum to 1 (the mean); the two sizes: 2.
    torch.testing.assert_close(weights.sum(0), torch.full((9,), 2.0))
    assert weights[9:, 4].tolist() == [0.25] * 4  # the centre lies under every 2 x 2 window
    # A window larger than the grid is cut to it, and short of the whole of it: something is left to attend to.
    assert window_removals((2, 2), (3,))[0].tolist() == [[True, False, True, False], [False, True, False, True]]


@pytest.mark.parametrize("decoder", [dict(style="bahdanau", score="additive", rnn="lstm"), TINY_TRANSFORMER], ids=["bahdanau", "transformer"])
def test_the_batched_estimator_is_the_checked_one(vocab, decoder):
    """Every caption of a batch at once equals attnkit.importance's windows hidden from attention, one caption at a
    time through Captum (the estimator chosen on scenes)."""
    model, batch = GridModel(vocab, **decoder).eval(), _batch()
    with torch.no_grad():
        encoded = model.encode(batch.source)
    batched = windows_hidden_from_attention(model.decoder, encoded, batch.target, rows_at_once=20)  # (B, T, P), photos in chunks
    assert (DISTILLED_WINDOWS, CHOSEN["image"], DEFAULT_HIDING["image"]) == (DEFAULT_WINDOWS, "windows", "attention")  # the image estimator chosen on scenes
    settings = ImportanceSettings(("windows",), window_sizes=DISTILLED_WINDOWS, hide_at="attention")
    for i, length in enumerate((5, 3, 6)):
        hideable = HideableSource(GRID, lambda keep: None, "image")  # hidden from attention: the input is never encoded again
        one = importance_maps(model.decoder, encoded.row(i), hideable, batch.target[i, :length], settings)["windows"]  # (T_i, P)
        torch.testing.assert_close(batched[i, : length - 1], one, atol=1e-5, rtol=1e-4)


def test_the_objective_distils_a_share_of_the_batch(vocab):
    model, batch = GridModel(vocab, style="bahdanau", score="additive", rnn="lstm").train(), _batch()
    off = Seq2SeqObjective()(model, batch)
    on = Seq2SeqObjective(importance_distillation=0.5, distillation_share=0.5)(model, batch)
    assert model.training  # the importance pass runs in eval mode and gives the mode back
    rows = distilled_rows(3, 0.5)
    assert rows.tolist() == [0, 2]  # spread over the batch
    model.eval()
    with torch.no_grad():
        encoded = model.encode(batch.source)
        attention = model.decoder(encoded, batch.target[:, :-1]).attention  # (B, T, P)
    importance = windows_hidden_from_attention(model.decoder, model.encode(batch.source), batch.target)[rows]
    is_token = (batch.target[:, 1:] != 0)[rows]
    lost = importance.clamp_min(0) * is_token.unsqueeze(-1)
    wanted = lost / lost.sum(-1, keepdim=True).clamp_min(1e-12)
    expected = 0.5 * supervision_loss(attention[rows], wanted).sum() * 3 / 2
    assert off.per_example_sum == 0 and on.per_example_sum.item() == pytest.approx(expected.item(), rel=1e-4)
    on.loss().backward()
    scorer = [p for name, p in model.decoder.named_parameters() if "attention" in name]
    assert scorer and any(p.grad is not None and p.grad.abs().sum() > 0 for p in scorer)


def test_the_targets_are_computed_in_fp32_inside_a_bf16_training_step(vocab):
    """The loss runs under the training step's autocast: in bf16 the importance targets came from bf16 log-probabilities."""
    from attnkit.distillation import distillation_targets

    model, batch = GridModel(vocab, style="bahdanau", score="additive", rnn="lstm").train(), _batch()
    is_token = batch.target[:, 1:] != 0
    fp32 = distillation_targets(model, batch.source, batch.target, is_token)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        in_bf16_step = distillation_targets(model, batch.source, batch.target, is_token)
    assert in_bf16_step.dtype == torch.float32
    torch.testing.assert_close(in_bf16_step, fp32, rtol=0, atol=0)


def test_every_caption_of_a_batch_gets_its_turn():
    assert distilled_rows(64, 0.1).tolist() == [0, 10, 21, 32, 42, 52, 63]  # linspace(0, 63, 7) rounded half to even
    assert distilled_rows(5, 1.0).tolist() == [0, 1, 2, 3, 4] and distilled_rows(5, 0.01).tolist() == [0]


def test_the_rows_and_windows_reach_the_device_once_not_every_step():
    """Made on the host, they are copied to the model's device once per batch size and grid: on a GPU a copy from the
    host's memory in every training step would wait for it each time."""
    device = torch.device("cpu")
    assert distilled_rows(64, 0.1, device) is distilled_rows(64, 0.1, device)
    assert all(a is b for a, b in zip(window_removals_on(GRID, (1, 2), device), window_removals_on(GRID, (1, 2), device)))
    torch.testing.assert_close(window_removals_on(GRID, (1, 2), device), window_removals(GRID, (1, 2)))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["task=translation", "train.importance_distillation=0.1"], "train.importance_distillation: it distils importance over a photo's grid"),
        (["task=multitask", "train.importance_distillation=0.1"], "not task multitask"),
        (["task=captioning", "train.distillation_share=0"], "train.distillation_share"),
        (["task=captioning", "train.importance_distillation=-1"], "train.importance_distillation"),
    ],
)
def test_distillation_outside_captioning_or_out_of_range_is_refused(overrides, message):
    with pytest.raises(UserError, match=message):
        load_config(None, overrides)
