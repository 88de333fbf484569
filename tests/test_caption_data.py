"""The captioning dataset format: write, read back, find the images."""

import json

import pytest

from attnkit.data.captions import CaptionedImage, image_root, read_caption_split, require_split_photos, write_caption_dataset
from attnkit.data.text import read_parallel, write_parallel_dataset
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


def test_split_files_end_lines_at_newlines_only_and_drop_a_byte_order_mark(tmp_path):
    """Path.read_text's universal newlines made a lone \\r inside a sentence a line break: two line-aligned files fell
    out of step (`evaluate --split` scored 51 pairs of a 50-line split). A byte-order mark stayed in the first
    sentence, or in the first photo's name (which then was 'not found')."""
    folder = write_parallel_dataset(tmp_path / "text", ("fr", "en"), {"train": [("a b", "c d"), ("e f", "g h")]})
    (folder / "train.fr").write_bytes(b"\xef\xbb\xbfa\rb\r\ne f\r\n")
    assert read_parallel(folder, "train", "fr", "en") == [("a\rb", "c d"), ("e f", "g h")]
    captions = write_caption_dataset(tmp_path / "captions", {"train": [CaptionedImage("a.jpg", ("x",))]}, tmp_path)
    (captions / "train.tsv").write_bytes(b"\xef\xbb\xbfa.jpg\tone\rtwo\n")
    assert read_caption_split(captions, "train") == [CaptionedImage("a.jpg", ("one\rtwo",))]
    info = json.loads((captions / "dataset.json").read_text())
    (captions / "dataset.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(info).encode())
    assert image_root(captions) == tmp_path.resolve()


def test_a_blank_caption_or_an_image_root_that_is_no_path_is_one_message(tmp_path):
    """A blank reference reached pycocoevalcap's CIDEr as 'max() arg is an empty sequence'; "image_root": null
    reached Path() as a TypeError."""
    folder = write_caption_dataset(tmp_path / "set", {"train": [CaptionedImage("a.jpg", ("x",))]}, tmp_path)
    (folder / "train.tsv").write_text("a.jpg\tfine\na.jpg\t  \n")
    with pytest.raises(UserError, match=r"train.tsv:2: the caption of a.jpg is empty"):
        read_caption_split(folder, "train")
    info = json.loads((folder / "dataset.json").read_text())
    for root in (None, 3, ""):
        (folder / "dataset.json").write_text(json.dumps({**info, "image_root": root}))
        with pytest.raises(UserError, match="image_root must be a folder's path"):
            image_root(folder)


def test_missing_photos_of_either_split_are_said_before_training(tmp_path):
    """Without a feature cache photos are read lazily: a missing one stopped the run mid-epoch, in a loader worker
    (with the worker's traceback), or at the first validation."""
    (tmp_path / "a.jpg").write_bytes(b"x")
    (tmp_path / "folder.jpg").mkdir()
    require_split_photos(tmp_path, {"train": [CaptionedImage("a.jpg", ("x",))]})
    with pytest.raises(UserError, match=r"the valid split: .*b.jpg: file not found"):
        require_split_photos(tmp_path, {"train": [CaptionedImage("a.jpg", ("x",))], "valid": [CaptionedImage("b.jpg", ("y",))]})
    with pytest.raises(UserError, match=r"the train split: .*folder.jpg: is a directory"):
        require_split_photos(tmp_path, {"train": [CaptionedImage("folder.jpg", ("x",))]})
