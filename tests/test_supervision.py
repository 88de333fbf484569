"""Attention supervision: the gold attention read from the scenes, the loss, and what training with it does."""

from pathlib import Path

import pytest
import torch

from attnkit.data.batching import Batch, batch_gold, pad_sequences
from attnkit.data.captions import write_caption_dataset, CaptionedImage
from attnkit.data.scenes import read_scene_split, write_scene_dataset
from attnkit.interfaces import DecoderOutput
from attnkit.errors import UserError
from attnkit.losses import Seq2SeqObjective, supervision_loss
from attnkit.multitask import train_multitask
from attnkit.supervision import caption_gold, translation_gold
from test_multitask import grounding_by_hand, tiny_joint_config


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> Path:
    return write_scene_dataset(tmp_path_factory.mktemp("scenes"), {"train": 60, "valid": 6, "test": 6}, seed=0, size=64)


def test_the_loss_is_zero_exactly_when_the_attention_is_the_gold_distribution():
    gold = torch.zeros(2, 3, 4)
    gold[0, 0] = torch.tensor([0.5, 0.5, 0.0, 0.0])
    gold[1, 2, 3] = 1.0  # the other steps have no gold
    attention = torch.softmax(torch.randn(2, 3, 4), -1)
    attention[0, 0], attention[1, 2] = gold[0, 0], gold[1, 2]
    assert torch.equal(supervision_loss(attention, gold), torch.zeros(2))  # steps without gold add nothing
    attention[1, 2] = torch.tensor([0.1, 0.0, 0.0, 0.9])
    loss = supervision_loss(attention, gold)
    assert loss[0] == 0 and loss[1] == pytest.approx(-torch.log(torch.tensor(0.9)).item())
    attention[0, 0] = torch.tensor([0.0, 1.0, 0.0, 0.0])  # a gold position with zero attention: large but finite
    assert torch.isfinite(supervision_loss(attention, gold)).all() and supervision_loss(attention, gold)[0] > 10


def test_the_objective_adds_the_weighted_loss_per_example_only_when_asked():
    attention = torch.softmax(torch.randn(2, 3, 4), -1, dtype=torch.float)
    gold = batch_gold([((0, 1, 1.0),), ((1, 2, 0.5), (1, 3, 0.5))])
    assert gold.dense(attention)[1, 1].tolist() == [0, 0, 0.5, 0.5] and gold.dense(attention).sum() == 2

    class Fixed(torch.nn.Module):
        def forward(self, batch, teacher_forcing, need_attention=True):
            return DecoderOutput(torch.zeros(2, 3, 6), attention, torch.ones(2, 4, dtype=torch.bool))

    batch = Batch(None, pad_sequences([[2, 4, 5, 3], [2, 4, 5, 3]]).ids, torch.arange(2), gold)
    off = Seq2SeqObjective()(Fixed(), batch)
    on = Seq2SeqObjective(attention_supervision=2.0)(Fixed(), batch)
    expected = 2.0 * supervision_loss(attention, gold.dense(attention)).sum()
    assert off.per_example_sum == 0 and on.per_example_sum == pytest.approx(expected.item())
    assert on.loss() == pytest.approx((off.loss() + expected / 2).item())  # the penalty is a mean over examples


def test_gold_comes_from_the_scene_ground_truth(scenes):
    (image, scene), *_ = read_scene_split(scenes, "train")
    sentence = scene.sentences[0]
    gold = caption_gold(read_scene_split(scenes, "train"), (4, 4))(image, sentence.english)
    by_step: dict[int, list[tuple[int, float]]] = {}
    for step, cell, weight in gold:
        by_step.setdefault(step, []).append((cell, weight))
    assert sorted(by_step) == [step for step, referent in enumerate(sentence.referents) if referent is not None]
    for step, cells in by_step.items():
        assert sum(w for _, w in cells) == pytest.approx(1.0)
        x0, y0, x1, y1 = scene.objects[sentence.referents[step]].drawn_box
        for cell, _ in cells:  # 16 px cells of the 64 px scene, row-major
            row, column = divmod(cell, 4)
            assert column * 16 < x1 and (column + 1) * 16 > x0 and row * 16 < y1 and (row + 1) * 16 > y0
    assert caption_gold(read_scene_split(scenes, "train"), (4, 4))(image, ["an", "unknown", "caption"]) is None

    pairs = translation_gold(read_scene_split(scenes, "train"))(sentence.french, sentence.english)
    assert {(french, english) for english, french, _ in pairs} == set(sentence.sure)


@pytest.mark.slow
def test_a_tiny_scene_model_trained_with_supervision_points_better_on_the_same_seed(scenes, tmp_path):
    settings = ["image_encoder.grid_size=4", "image_encoder.blocks=7", "train.epochs=6", "train.lr=0.01", "train.patience=0"]  # resnet18 to stride 16: 4 x 4 cells of 16 px
    found = {}
    for weight in (0, 1):
        run = tmp_path / f"weight-{weight}"
        progress = train_multitask(tiny_joint_config(scenes, run, *settings, f"train.attention_supervision={weight}"), progress_bar=False, log=lambda *a: None)
        assert progress.epoch == 6
        found[weight] = grounding_by_hand(str(run / "last.pt"), "test", scenes=30, reading=False, size=64)
    (pointing_without, aer_without), (pointing_with, aer_with) = found[0], found[1]
    assert pointing_with > pointing_without + 0.1 and aer_with < aer_without - 0.1, found


def test_supervision_needs_scene_ground_truth(scenes, tmp_path):
    def train(*settings: str):
        train_multitask(tiny_joint_config(scenes, tmp_path / "run", "train.attention_supervision=1", *settings), progress_bar=False, log=lambda *a: None)

    def captions(folder: Path, caption: str) -> Path:
        item = CaptionedImage("train-00000.png", (caption,))
        return write_caption_dataset(folder, {"train": [item], "valid": [item]}, scenes / "images")

    with pytest.raises(UserError, match="not part of a scene folder"):
        train(f"data.path={captions(tmp_path / 'plain', 'a large red circle')}")
    with pytest.raises(UserError, match="none of the training captions .* matches"):  # captions the scenes do not know
        train(f"data.path={captions(scenes / 'other-captions', 'a purple thing')}")
    with pytest.raises(UserError, match="fixed image_encoder.grid_size"):
        train("image_encoder.grid_size=0", "image_encoder.position_embedding=false")
    assert not (tmp_path / "run" / "last.pt").exists()
