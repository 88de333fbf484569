"""The captioning dataset format: write, read back, find the images."""

import json

import pytest

from attnkit.data.captions import CaptionedImage, image_root, read_caption_split, write_caption_dataset
from attnkit.errors import UserError


def test_caption_dataset_round_trip_keeps_every_caption_and_finds_the_images(tmp_path):
    images = tmp_path / "photos"
    images.mkdir()
    splits = {
        "train": [CaptionedImage("a.jpg", ("A dog runs .", "a\tdog\nrunning")), CaptionedImage("sub/b.png", ("A cat .",))],
        "test": [CaptionedImage("c.jpg", ("x", "y", "z"))],
    }
    folder = write_caption_dataset(tmp_path / "data" / "set", splits, images, info={"name": "toy"})
    info = json.loads((folder / "dataset.json").read_text())
    assert info["task"] == "captioning" and info["splits"] == {"train": 2, "test": 1} and info["captions"] == {"train": 3, "test": 3}
    assert info["image_root"] == "../../photos" and image_root(folder) == images.resolve()
    train = read_caption_split(folder, "train")
    assert train == [CaptionedImage("a.jpg", ("A dog runs .", "a dog running")), CaptionedImage("sub/b.png", ("A cat .",))]
    assert read_caption_split(folder, "test") == splits["test"]


def test_caption_dataset_errors_are_one_message(tmp_path):
    folder = write_caption_dataset(tmp_path / "set", {"train": [CaptionedImage("a.jpg", ("x",))]}, tmp_path)
    with pytest.raises(UserError, match="has no split 'valid'"):
        read_caption_split(folder, "valid")
    (folder / "train.tsv").write_text("no tab here\n")
    with pytest.raises(UserError, match="expected image<TAB>caption"):
        read_caption_split(folder, "train")
    (folder / "dataset.json").write_text(json.dumps({"task": "translation"}))
    with pytest.raises(UserError, match="not a captioning dataset"):
        image_root(folder)
