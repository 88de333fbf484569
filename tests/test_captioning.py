"""Captioning through the shared decoder: learns tiny synthetic images; batched search equals one at a time."""

import pytest
import torch
from PIL import Image

from attnkit.captioning import Captioner, train_captioning
from attnkit.config import load_config
from attnkit.data.captions import CaptionedImage, read_caption_split, write_caption_dataset

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220), "yellow": (230, 220, 30), "black": (5, 5, 5), "white": (250, 250, 250)}
SHAPES = {"square": lambda d, c: d.rectangle([8, 8, 24, 24], fill=c), "circle": lambda d, c: d.ellipse([8, 8, 24, 24], fill=c)}


def write_shape_images(folder):
    """12 tiny images: a coloured square or circle on grey; caption 'a COLOUR SHAPE'; the dataset folder."""
    from PIL import ImageDraw

    (folder / "images").mkdir()
    items = []
    for colour, rgb in COLOURS.items():
        for shape, draw in SHAPES.items():
            image = Image.new("RGB", (32, 32), (128, 128, 128))
            draw(ImageDraw.Draw(image), rgb)
            name = f"{colour}-{shape}.png"
            image.save(folder / "images" / name)
            items.append(CaptionedImage(name, (f"a {colour} {shape} .", f"A {colour} {shape}")))
    return write_caption_dataset(folder / "data", {"train": items, "valid": items, "test": items}, folder / "images")


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    return write_shape_images(tmp_path_factory.mktemp("scenes"))


TINY = [
    "task=captioning", "image_encoder.backbone=resnet18", "image_encoder.weights=none", "image_encoder.image_size=64",
    "image_encoder.grid_size=2", "image_encoder.memory_size=32", "decoder.embedding_size=16", "decoder.hidden_size=48",
    "decoder.attention_size=16", "decoder.dropout=0.0", "decoder.style=luong", "decoder.score=general",
    "data.tokenizer.kind=space", "data.feature_cache=", "train.batch_size=4", "train.lr=0.005", "train.patience=0",
    "train.attention_regularization=0.5", "search.beam_size=1", "search.max_length_ratio=0", "search.max_length_offset=6",
]  # fmt: skip


@pytest.mark.slow
def test_captioning_learns_tiny_synthetic_images(scenes, tmp_path):
    config = load_config(None, [f"data.path={scenes}", f"output_dir={tmp_path}", "train.epochs=30", *TINY])
    train_captioning(config, progress_bar=False, log=lambda _: None)
    captioner = Captioner.from_checkpoint(tmp_path / "best.pt", device="cpu")
    items = read_caption_split(scenes, "test")
    captions = captioner.caption([scenes.parent / "images" / item.image for item in items], beam_size=1)
    correct = sum(c[0].text == item.captions[0].lower().rstrip(" .") for c, item in zip(captions, items))
    assert correct >= 11, [c[0].text for c in captions]
    first = captions[0][0]
    assert first.grid == (2, 2) and first.attention.shape == (len(first.words) + first.finished, 4)
    torch.testing.assert_close(first.attention.sum(1), torch.ones(first.attention.shape[0]))


def test_batched_beam_search_on_images_equals_one_at_a_time(scenes, tmp_path):
    config = load_config(None, [f"data.path={scenes}", f"output_dir={tmp_path}", "train.epochs=2", *TINY])
    train_captioning(config, progress_bar=False, log=lambda _: None)
    captioner = Captioner.from_checkpoint(tmp_path / "last.pt", device="cpu")
    paths = sorted((scenes.parent / "images").iterdir())
    together = captioner.caption(paths, beam_size=3, batch_size=12)
    for path, batched in zip(paths, together):
        alone = captioner.caption([path], beam_size=3)[0]
        assert alone[0].words == batched[0].words
        assert alone[0].score == pytest.approx(batched[0].score, abs=1e-4)


def test_unreadable_images_get_an_error_and_the_others_a_caption(scenes, tmp_path):
    config = load_config(None, [f"data.path={scenes}", f"output_dir={tmp_path}", "train.epochs=1", *TINY])
    train_captioning(config, progress_bar=False, log=lambda _: None)
    captioner = Captioner.from_checkpoint(tmp_path / "last.pt", device="cpu")
    (tmp_path / "broken.png").write_text("no image here")
    good = next((scenes.parent / "images").iterdir())
    results = captioner.caption([good, tmp_path / "missing.png", tmp_path / "broken.png", tmp_path, good], beam_size=2)
    assert [r[0].error is None for r in results] == [True, False, False, False, True]
    assert "file not found" in results[1][0].error and "not an image" in results[2][0].error and "directory" in results[3][0].error
    assert results[0][0].words == results[4][0].words


@pytest.mark.slow
def test_caption_and_evaluate_scripts_end_to_end(scenes, tmp_path, capsys, monkeypatch):
    import json

    from attnkit.errors import run_cli
    from conftest import ROOT
    from attnkit.commands import caption, evaluate, train

    monkeypatch.chdir(ROOT)
    argv = ["--config", "tasks/configs/tiny.yaml", "--no-progress", *(a for s in [f"data.path={scenes}", f"output_dir={tmp_path / 'run'}", "train.epochs=1", *TINY] for a in ("--set", s))]
    assert run_cli(train.main, argv) == 0
    checkpoint = str(tmp_path / "run" / "best.pt")
    images = sorted((scenes.parent / "images").iterdir())[:3]
    capsys.readouterr()
    png = tmp_path / "overlay.png"
    assert run_cli(caption.main, ["--checkpoint", checkpoint, "--beam", "2", "--attention-png", str(png), *map(str, images)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in lines] == [str(p) for p in images]
    assert all((tmp_path / f"overlay-{n}.png").stat().st_size > 1000 for n in (1, 2, 3))

    (tmp_path / "bad.jpg").write_bytes(b"\xff\xd8 truncated")
    assert run_cli(caption.main, ["--checkpoint", checkpoint, str(images[0]), str(tmp_path / "bad.jpg")]) == 1
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 1 and "bad.jpg" in captured.err and "Traceback" not in captured.err

    assert run_cli(evaluate.main, ["--checkpoint", checkpoint, "--split", "test", "--beam", "1"]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert {"bleu1", "bleu4", "cider_d", "meteor", "bleu4_nltk"} <= set(scores) and scores["images"] == 12
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("".join(f"{p.name}#0\tA caption for {p.stem} .\n" for p in images))
    assert run_cli(evaluate.main, ["--checkpoint", checkpoint, "--images", str(images[0].parent), "--captions", str(tokens)]) == 0
    assert json.loads(capsys.readouterr().out)["images"] == 3
    (tmp_path / "gone.txt").write_text("gone-1.jpg#0\tA caption .\ngone-2.jpg#0\tAnother .\n")
    assert run_cli(evaluate.main, ["--checkpoint", checkpoint, "--images", str(images[0].parent), "--captions", str(tmp_path / "gone.txt")]) == 2
    assert "none of the 2 images could be read" in capsys.readouterr().err  # not scores of empty captions, exit 0
    assert run_cli(evaluate.main, ["--checkpoint", checkpoint, "--source", "x", "--reference", "y"]) == 2
    assert "are for translation checkpoints" in capsys.readouterr().err


def test_a_checkpoint_needs_neither_the_weights_file_nor_new_features(scenes, tmp_path):
    """Trained from a local weights file with the feature cache; the file is then deleted: the checkpoint still
    captions, and it keys the same cache entries (same weights digest), so nothing is recomputed."""
    import torchvision

    torch.manual_seed(0)
    weights = tmp_path / "resnet18.pth"
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), weights)
    cache = tmp_path / "cache"
    overrides = [f"image_encoder.weights={weights}", f"data.feature_cache={cache}"]
    config = load_config(None, [f"data.path={scenes}", f"output_dir={tmp_path / 'run'}", "train.epochs=1", *TINY, *overrides])
    train_captioning(config, progress_bar=False, log=lambda _: None)
    entries = sorted(cache.rglob("*.pt"))
    weights.unlink()
    captioner = Captioner.from_checkpoint(tmp_path / "run" / "best.pt", device="cpu", cache_dir=cache)
    assert captioner.cache is not None
    images = sorted((scenes.parent / "images").iterdir())
    assert all(not c[0].error for c in captioner.caption(images))
    assert captioner.cache.stats.misses == 0 and sorted(cache.rglob("*.pt")) == entries


@pytest.mark.slow
def test_fine_tuning_the_last_block_trains_on_the_cached_frozen_prefix(scenes, tmp_path):
    """``trainable_blocks`` with the feature cache: the frozen prefix's maps are cached once, the last block learns
    on them, and the checkpoint captions the same from the cache as from pixels."""
    import torchvision

    torch.manual_seed(0)
    weights = tmp_path / "resnet18.pth"
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), weights)
    cache = tmp_path / "cache"
    overrides = [f"image_encoder.weights={weights}", f"data.feature_cache={cache}", "image_encoder.trainable_blocks=1", "image_encoder.grid_size=1"]
    config = load_config(None, [f"data.path={scenes}", f"output_dir={tmp_path / 'run'}", "train.epochs=1", *TINY, *overrides])
    train_captioning(config, progress_bar=False, log=lambda _: None)
    entries = sorted(cache.rglob("*.pt"))
    assert len(entries) == 12 and torch.load(entries[0], weights_only=True).shape == (512, 2, 2)  # the map before the last block (64 px / 32), not the pooled 1 x 1 grid
    with_cache = Captioner.from_checkpoint(tmp_path / "run" / "best.pt", device="cpu", cache_dir=cache)
    pixels_only = Captioner.from_checkpoint(tmp_path / "run" / "best.pt", device="cpu")
    last = with_cache.model.encoder_for("image").backbone[-1]
    pretrained = torchvision.models.resnet18(weights=None)
    pretrained.load_state_dict(torch.load(weights, weights_only=True))
    assert not torch.equal(last.conv1.weight, pretrained.layer4[1].conv1.weight)  # the fine-tuned block moved
    images = sorted((scenes.parent / "images").iterdir())
    assert [c[0].text for c in with_cache.caption(images)] == [c[0].text for c in pixels_only.caption(images)]
    assert with_cache.cache.stats.misses == 0


def test_training_mosaics_carry_the_described_photo_s_captions_in_a_seeded_quadrant():
    from pathlib import Path

    from attnkit.captioning import with_training_mosaics
    from attnkit.data.images import MosaicFile

    paths = [Path(f"p{i}.png") for i in range(8)]
    image_ids = [i for i in range(8) for _ in range(2)]
    caption_ids = [[i, copy] for i in range(8) for copy in range(2)]
    found, mosaic_image_ids, mosaic_caption_ids = with_training_mosaics(paths, image_ids, caption_ids, 0.5, seed=3)
    assert found[:8] == paths and len(found) == 12 and all(isinstance(m, MosaicFile) for m in found[8:])
    assert mosaic_image_ids[:16] == image_ids and mosaic_caption_ids[:16] == caption_ids
    for image, ids in zip(mosaic_image_ids[16:], mosaic_caption_ids[16:]):
        described = paths[ids[0]]
        assert described in found[image].photos and len(set(found[image].photos)) == 4
    assert len(mosaic_image_ids) == 16 + 4 * 2  # each mosaic with both captions of its photo
    assert with_training_mosaics(paths, image_ids, caption_ids, 0.5, seed=3)[0] == found
    assert with_training_mosaics(paths, image_ids, caption_ids, 0.5, seed=4)[0] != found
    quadrants = {found[image].photos.index(paths[ids[0]]) for image, ids in zip(mosaic_image_ids[16:], mosaic_caption_ids[16:])}
    assert len(quadrants) > 1
    assert with_training_mosaics(paths, image_ids, caption_ids, 0.0, seed=3) == (paths, image_ids, caption_ids)


def test_a_captioner_trains_on_mosaics_of_its_photos(scenes, tmp_path):
    lines = []
    config = load_config(None, [f"data.path={scenes}", f"output_dir={tmp_path}", "train.epochs=1", "data.mosaic_share=0.5", *TINY])
    train_captioning(config, progress_bar=False, log=lines.append)
    assert any("12 images (and 6 mosaics of them) for training, 36 captions" in line for line in lines), lines
    assert Captioner.from_checkpoint(tmp_path / "last.pt", device="cpu").caption([next((scenes.parent / "images").iterdir())], beam_size=1)[0][0].words


@pytest.mark.slow
def test_an_ensemble_of_one_checkpoint_twice_captions_as_that_checkpoint(scenes, tmp_path, capsys, vocab):
    """attnkit caption / evaluate with --checkpoint given twice; checkpoints that cannot decode together are refused
    (another vocabulary, a translation model) with one message before any image is read."""
    import json

    from attnkit.checkpoint import save_checkpoint
    from attnkit.commands import caption, evaluate
    from attnkit.errors import run_cli
    from test_average import checkpoint_of
    from conftest import tiny_model

    config = load_config(None, [f"data.path={scenes}", f"output_dir={tmp_path / 'run'}", "train.epochs=2", *TINY])
    train_captioning(config, progress_bar=False, log=lambda _: None)
    checkpoint = str(tmp_path / "run" / "last.pt")
    paths = sorted((scenes.parent / "images").iterdir())
    alone = Captioner.from_checkpoint(checkpoint, device="cpu").caption(paths, beam_size=3, n_best=2)
    twice = Captioner.from_checkpoints([checkpoint, checkpoint], device="cpu").caption(paths, beam_size=3, n_best=2)
    for one, other in zip(alone, twice):
        assert [c.words for c in one] == [c.words for c in other]
        assert [c.score for c in one] == pytest.approx([c.score for c in other], abs=1e-5)
    capsys.readouterr()
    assert run_cli(caption.main, ["--checkpoint", checkpoint, "--checkpoint", checkpoint, "--beam", "3", *map(str, paths[:2])]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{p}\t{c[0].text}" for p, c in zip(paths[:2], alone)]
    assert run_cli(evaluate.main, ["--checkpoint", checkpoint, "--checkpoint", checkpoint, "--split", "test", "--beam", "1", "--limit", "3"]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoint"] == [checkpoint, checkpoint]

    # a captioner of other captions: another vocabulary
    relabelled = [item.__class__(item.image, (f"one {item.image.split('-')[0]} thing",)) for item in read_caption_split(scenes, "train")]
    other_data = write_caption_dataset(tmp_path / "other", {"train": relabelled, "valid": relabelled, "test": relabelled}, scenes.parent / "images")
    config = load_config(None, [f"data.path={other_data}", f"output_dir={tmp_path / 'other-run'}", "train.epochs=1", *TINY])
    train_captioning(config, progress_bar=False, log=lambda _: None)
    translator = tmp_path / "translation.pt"
    save_checkpoint(translator, checkpoint_of(tiny_model(vocab), vocab))
    for ensemble, message in [
        ([checkpoint, str(tmp_path / "other-run" / "last.pt")], "has another vocabulary than the first checkpoint"),
        ([checkpoint, str(translator)], "translation"),
    ]:
        assert run_cli(caption.main, [a for path in ensemble for a in ("--checkpoint", path)] + [str(paths[0])]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and err.count("\n") == 1, err
    assert run_cli(evaluate.main, ["--checkpoint", str(translator), "--checkpoint", str(translator), "--split", "test"]) == 2
    assert "ensemble, which attnkit evaluate does for captioning" in capsys.readouterr().err
