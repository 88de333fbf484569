"""data_scripts/prepare_flickr8k.py, prepare_coco.py and prepare_caption_folder.py: one captioning format."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from PIL import Image

from attnkit.data.captions import CaptionedImage, image_root, read_caption_split
from attnkit.errors import run_cli
from conftest import needs_shared

ROOT = Path(__file__).resolve().parents[1]


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"_data_scripts_{name}", ROOT / "data_scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


flickr8k = load_script("prepare_flickr8k")
coco = load_script("prepare_coco")
caption_folder = load_script("prepare_caption_folder")


def make_images(folder: Path, *names: str) -> None:
    """Tiny real image files (JPEG or PNG by the name's suffix)."""
    for number, name in enumerate(names):
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (4, 3), (number * 40 % 256, 100, 200)).save(path)


def read_back(folder: Path) -> dict[str, list[CaptionedImage]]:
    info = json.loads((folder / "dataset.json").read_text(encoding="utf-8"))
    splits = {name: read_caption_split(folder, name) for name in info["splits"]}
    root = image_root(folder)
    for items in splits.values():
        for item in items:
            assert (root / item.image).is_file(), item.image
    return splits


def images_of(items: list[CaptionedImage]) -> list[str]:
    return [item.image for item in items]


def fails(main, argv, capsys, *fragments: str) -> str:
    """``main`` on ``argv`` exits 2 with one 'error: ...' line on stderr holding each fragment."""
    assert run_cli(main, argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err
    return err


# ---------------------------------------------------------------- Flickr8k


def write_flickr8k(root: Path, token_lines=None, lists=None, images=("a.jpg", "b.jpg", "c.jpg", "d.jpg", "e.jpg", "f.jpg")) -> Path:
    """A tiny Flickr8k folder under ``root/flickr8k``: 6 images, g.jpg listed but absent, f.jpg uncaptioned."""
    folder = root / "flickr8k"
    (folder / "images").mkdir(parents=True)
    make_images(folder / "images", *images)
    if token_lines is None:
        token_lines = [f"{image}#{k}\t{image[0].upper()} caption {k} of {image} ." for image in ("a.jpg", "b.jpg", "c.jpg", "d.jpg", "e.jpg", "g.jpg") for k in range(5)]
        token_lines[1] = "a.jpg#1 A caption after a space, as on 3 lines of the original file ."
        token_lines.append("notlisted.jpg#0\tAn image in no split list .")
    (folder / "Flickr8k.token.txt").write_text("\n".join(token_lines) + "\n", encoding="utf-8")
    if lists is None:
        lists = {"train": ["a.jpg", "b.jpg", "g.jpg", "f.jpg", "a.jpg"], "dev": ["c.jpg"], "test": ["d.jpg", "e.jpg"]}
    for name, names in lists.items():
        (folder / f"Flickr_8k.{name}Images.txt").write_text("".join(f"{n}\r\n" for n in names), encoding="utf-8")
    return folder


def test_flickr8k_writes_standard_splits_with_raw_captions_and_skip_counts(tmp_path, capsys):
    write_flickr8k(tmp_path / "data")
    out = tmp_path / "out"
    assert run_cli(flickr8k.main, ["--data", str(tmp_path / "data"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "train: 2 images, 10 captions; skipped 2 of 4 listed (1 not in the images folder, 1 without captions)" in printed
    splits = read_back(out)
    assert {name: images_of(items) for name, items in splits.items()} == {"train": ["a.jpg", "b.jpg"], "valid": ["c.jpg"], "test": ["d.jpg", "e.jpg"]}
    assert all(len(item.captions) == 5 for items in splits.values() for item in items)
    assert splits["train"][0].captions[:2] == ("A caption 0 of a.jpg .", "A caption after a space, as on 3 lines of the original file .")
    assert image_root(out) == (tmp_path / "data" / "flickr8k" / "images").resolve()
    info = json.loads((out / "dataset.json").read_text())
    assert info["task"] == "captioning" and info["language"] == "en" and info["image_root"] == "../data/flickr8k/images"
    assert info["splits"] == {"train": 2, "valid": 1, "test": 2} and info["captions"] == {"train": 10, "valid": 5, "test": 10}
    assert info["counts"]["skipped"]["train"] == {"not_in_images_folder": 1, "without_captions": 1, "excluded_photos": 0}
    assert "Hodosh" in info["citation"] and "research use" in info["license"]
    assert info["command"].startswith("python data_scripts/prepare_flickr8k.py --data ")


def test_flickr8k_reads_attnkit_data_and_a_separate_images_folder(tmp_path, monkeypatch):
    write_flickr8k(tmp_path / "data")
    photos = tmp_path / "photos"
    (tmp_path / "data" / "flickr8k" / "images").rename(photos)
    monkeypatch.setenv("ATTNKIT_DATA", str(tmp_path / "data"))
    assert run_cli(flickr8k.main, ["--out", str(tmp_path / "out"), "--images", str(photos)]) == 0
    assert image_root(tmp_path / "out") == photos.resolve()
    assert [len(items) for items in read_back(tmp_path / "out").values()] == [2, 1, 2]


@pytest.mark.parametrize(
    "change, fragments",
    [
        (lambda folder: (folder / "Flickr8k.token.txt").unlink(), ["caption file not found", "Flickr8k.token.txt"]),
        (lambda folder: (folder / "Flickr_8k.devImages.txt").unlink(), ["split list not found", "Flickr_8k.devImages.txt"]),
        (lambda folder: (folder / "Flickr8k.token.txt").write_text("a.jpg#0\tok .\na.jpg no number\n"), ["line 2", "expected '<image>#<k><TAB><caption>'"]),
        (lambda folder: (folder / "Flickr8k.token.txt").write_text("a.jpg#0\t  \n"), ["line 1", "empty"]),
        (lambda folder: (folder / "Flickr8k.token.txt").write_text("a.jpg#0\tx\na.jpg#0\ty\n"), ["line 2", "a.jpg#0 appears twice"]),
        (lambda folder: (folder / "Flickr8k.token.txt").write_bytes(b"a.jpg#0\t\xff\n"), ["not UTF-8"]),
        (lambda folder: (folder / "Flickr_8k.testImages.txt").write_text("c.jpg\n"), ["c.jpg is in both Flickr_8k.devImages.txt and Flickr_8k.testImages.txt"]),
        (lambda folder: (folder / "Flickr_8k.devImages.txt").write_text("h.jpg\ni.jpg\n"), ["no image of Flickr_8k.devImages.txt (2 named)", "is --images the Flickr8k photo folder?"]),
        (lambda folder: (folder / "images").rename(folder / "elsewhere"), ["images folder not found"]),
    ],
)
def test_flickr8k_bad_inputs_are_one_error(tmp_path, capsys, change, fragments):
    change(write_flickr8k(tmp_path / "data"))
    fails(flickr8k.main, ["--data", str(tmp_path / "data"), "--out", str(tmp_path / "out")], capsys, *fragments)
    assert not (tmp_path / "out" / "dataset.json").exists()


def test_flickr8k_without_the_folder_says_where_it_looked(tmp_path, capsys):
    fails(flickr8k.main, ["--data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")], capsys, "data root not found")
    fails(flickr8k.main, ["--data", str(tmp_path), "--out", str(tmp_path / "out")], capsys, "has no flickr8k folder")


def test_flickr8k_shared_subset_gives_the_documented_counts(tmp_path):
    folder = needs_shared("flickr8k")
    out = tmp_path / "flickr8k"
    assert flickr8k.main(["--data", str(folder.parent), "--out", str(out)]) == 0
    splits = read_back(out)  # also checks that every image path resolves to a file
    assert {name: len(items) for name, items in splits.items()} == {"train": 5273, "valid": 463, "test": 490}
    assert all(len(item.captions) == 5 for items in splits.values() for item in items)
    assert not set(images_of(splits["train"])) & (set(images_of(splits["valid"])) | set(images_of(splits["test"])))
    assert image_root(out) == (folder / "images").resolve()


def test_flickr8k_leaves_out_the_multi30k_val_and_test_photos_from_train_and_valid(tmp_path, capsys):
    folder, photo_lists = needs_shared("flickr8k"), needs_shared("multi30k", "task1", "image_splits")
    out = tmp_path / "joint"
    excluded = [f"--exclude-photos={photo_lists / name}" for name in ("val.txt", "test_2016_flickr.txt")]
    assert flickr8k.main(["--data", str(folder.parent), "--out", str(out), *excluded]) == 0
    assert "303 excluded" in capsys.readouterr().out
    splits = read_back(out)
    assert {name: len(items) for name, items in splits.items()} == {"train": 4970, "valid": 433, "test": 490}  # test stays whole
    left_out = {line.split(".")[0] for name in ("val.txt", "test_2016_flickr.txt") for line in (photo_lists / name).read_text().split()}
    assert not {image.split("_")[0] for image in images_of(splits["train"]) + images_of(splits["valid"])} & left_out


# ---------------------------------------------------------------- Karpathy JSON (COCO, Flickr8k, Flickr30k)


def karpathy_entry(filename, split, *raws, filepath=None):
    entry = {"filename": filename, "split": split, "imgid": 0, "sentences": [{"raw": raw, "tokens": ["tok"], "sentid": 0} for raw in raws]}
    if filepath is not None:
        entry["filepath"] = filepath
    return entry


def write_karpathy(tmp_path: Path, entries=None, dataset="coco") -> tuple[Path, Path]:
    images = tmp_path / "coco"
    if entries is None:
        entries = [
            karpathy_entry("t1.jpg", "train", "A man rides a moped. ", "a MAN\non a bike", filepath="train2014"),
            karpathy_entry("r1.jpg", "restval", "Restval one.", filepath="val2014"),
            karpathy_entry("v1.jpg", "val", "Val one.", filepath="val2014"),
            karpathy_entry("t2.jpg", "train", "Train two.", "  ", filepath="train2014"),
            karpathy_entry("e1.jpg", "test", "Test one.", filepath="val2014"),
            karpathy_entry("r2.jpg", "restval", "Restval two.", filepath="val2014"),
            karpathy_entry("n1.jpg", "train", filepath="train2014"),  # no sentence
        ]
        make_images(images, "train2014/t1.jpg", "train2014/t2.jpg", "val2014/r1.jpg", "val2014/v1.jpg", "val2014/e1.jpg", "train2014/n1.jpg")
    else:
        images.mkdir()
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps({"images": entries, "dataset": dataset}), encoding="utf-8")
    return path, images


def test_coco_restval_joins_train_and_raw_text_is_used(tmp_path, capsys):
    path, images = write_karpathy(tmp_path)
    out = tmp_path / "out"
    assert run_cli(coco.main, ["--json", str(path), "--images", str(images), "--out", str(out)]) == 0  # r2.jpg is missing: not checked
    splits = {name: read_caption_split(out, name) for name in ("train", "valid", "test")}
    assert images_of(splits["train"]) == ["train2014/t1.jpg", "val2014/r1.jpg", "train2014/t2.jpg", "val2014/r2.jpg"]
    assert splits["train"][0].captions == ("A man rides a moped.", "a MAN on a bike")
    assert splits["train"][2].captions == ("Train two.",)  # the empty sentence is dropped
    assert images_of(splits["valid"]) == ["val2014/v1.jpg"] and images_of(splits["test"]) == ["val2014/e1.jpg"]
    assert image_root(out) == images.resolve()
    info = json.loads((out / "dataset.json").read_text())
    assert info["counts"]["karpathy_splits"] == {"train": 3, "val": 1, "test": 1, "restval": 2}
    assert info["counts"]["dropped"]["no_sentences"] == 1 and info["counts"]["dropped"]["empty_sentences"] == 1
    assert "CC BY 4.0" in info["license"] and "Karpathy" in info["citation"] and info["options"]["restval"] == "train"
    assert "train: 4 images (train + restval), 5 captions" in capsys.readouterr().out


def test_coco_restval_skip_and_check_images(tmp_path, capsys):
    path, images = write_karpathy(tmp_path)
    out = tmp_path / "out"
    assert run_cli(coco.main, ["--json", str(path), "--images", str(images), "--out", str(out), "--restval", "skip", "--check-images"]) == 0
    splits = read_back(out)
    assert {name: images_of(items) for name, items in splits.items()} == {
        "train": ["train2014/t1.jpg", "train2014/t2.jpg"], "valid": ["val2014/v1.jpg"], "test": ["val2014/e1.jpg"]
    }
    info = json.loads((out / "dataset.json").read_text())
    assert info["counts"]["dropped"]["restval"] == 2 and info["counts"]["dropped"]["missing_files"]["train"] == 0
    assert "left out 2 restval images" in capsys.readouterr().out
    # with restval in train, --check-images leaves out the missing r2.jpg and counts it
    assert run_cli(coco.main, ["--json", str(path), "--images", str(images), "--out", str(out), "--check-images"]) == 0
    assert images_of(read_back(out)["train"]) == ["train2014/t1.jpg", "val2014/r1.jpg", "train2014/t2.jpg"]
    assert json.loads((out / "dataset.json").read_text())["counts"]["dropped"]["missing_files"] == {"train": 1, "valid": 0, "test": 0}
    assert "train: 3 images (train + restval), 4 captions; 1 missing image files left out" in capsys.readouterr().out


def test_coco_without_filepath_uses_the_filename_under_images(tmp_path):
    entries = [karpathy_entry(f"{name}.jpg", split, f"{name} caption.") for name, split in (("a", "train"), ("b", "val"), ("c", "test"))]
    path, images = write_karpathy(tmp_path, entries, dataset="flickr8k")
    make_images(images, "a.jpg", "b.jpg", "c.jpg")
    out = tmp_path / "out"
    assert coco.main(["--json", str(path), "--images", str(images), "--out", str(out), "--check-images"]) == 0
    splits = read_back(out)
    assert [images_of(items) for items in splits.values()] == [["a.jpg"], ["b.jpg"], ["c.jpg"]]
    info = json.loads((out / "dataset.json").read_text())
    assert info["name"] == "flickr8k-karpathy" and "Hodosh" in info["citation"]


@pytest.mark.parametrize(
    "content, fragments",
    [
        ("{not json", ["is not valid JSON"]),
        (json.dumps([1, 2]), ["expected an object with an \"images\" list"]),
        (json.dumps({"images": [{"split": "train", "sentences": []}]}), ["images[0]", "no \"filename\""]),
        (json.dumps({"images": [karpathy_entry("a.jpg", "dev", "x")]}), ["images[0] (a.jpg)", "\"split\" is 'dev'"]),
        (json.dumps({"images": [{"filename": "a.jpg", "split": "train", "sentences": [{"tokens": ["x"]}]}]}), ["sentence 0 has no \"raw\" text"]),
        (json.dumps({"images": [{"filename": "a.jpg", "split": "train"}]}), ["no \"sentences\" list"]),
        (json.dumps({"images": [karpathy_entry("a.jpg", "train", "x"), karpathy_entry("a.jpg", "val", "y")]}), ["images[1] and images[0] are both a.jpg"]),
        (json.dumps({"images": [karpathy_entry("a.jpg", "train", "x"), karpathy_entry("b.jpg", "val", "y")]}), ["no 'test' image with a caption", "0 listed"]),
    ],
)
def test_coco_bad_inputs_are_one_error(tmp_path, capsys, content, fragments):
    path = tmp_path / "dataset_coco.json"
    path.write_text(content, encoding="utf-8")
    fails(coco.main, ["--json", str(path), "--images", str(tmp_path), "--out", str(tmp_path / "out")], capsys, *fragments)


def test_coco_missing_files_are_one_error(tmp_path, capsys):
    path, images = write_karpathy(tmp_path)
    fails(coco.main, ["--json", str(tmp_path / "none.json"), "--images", str(images), "--out", str(tmp_path / "o")], capsys, "not found")
    fails(coco.main, ["--json", str(path), "--images", str(tmp_path / "none"), "--out", str(tmp_path / "o")], capsys, "images folder not found")
    (images / "val2014" / "e1.jpg").unlink()
    fails(coco.main, ["--json", str(path), "--images", str(images), "--out", str(tmp_path / "o"), "--check-images"], capsys,
          "no 'test' image with a caption that exists under --images")
    with pytest.raises(SystemExit) as exit_info:  # argparse: a required option is missing
        coco.main(["--json", str(path)])
    assert exit_info.value.code == 2


# ---------------------------------------------------------------- your own folder


def write_folder(tmp_path: Path, count: int = 20, header: bool = True) -> tuple[Path, Path]:
    images = tmp_path / "photos"
    names = [f"img{number:02d}.{'png' if number % 2 else 'jpg'}" for number in range(count - 1)] + ["sub dir/last.jpg"]
    make_images(images, *names)
    lines = ["image\tcaption"] if header else []
    for number, name in enumerate(names):
        lines += [f"{name}\tCaption one of {name} .", f"{name}\t  Caption\ttwo of {name}  "][: 1 + number % 2]
    captions = tmp_path / "captions.tsv"
    captions.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return images, captions


def test_caption_folder_random_split_is_by_image_seeded_and_in_file_order(tmp_path, capsys):
    images, captions = write_folder(tmp_path)
    argv = ["--images", str(images), "--captions", str(captions), "--valid", "3", "--test", "4"]
    assert run_cli(caption_folder.main, [*argv, "--out", str(tmp_path / "a")]) == 0
    splits = read_back(tmp_path / "a")
    assert [len(items) for items in splits.values()] == [13, 3, 4]
    everything = [image for items in splits.values() for image in images_of(items)]
    assert sorted(everything) == sorted(set(everything)) and len(everything) == 20  # every image once
    for items in splits.values():  # order of the captions file kept inside a split
        assert images_of(items) == sorted(images_of(items))
    by_image = {item.image: item.captions for items in splits.values() for item in items}
    assert by_image["img01.png"] == ("Caption one of img01.png .", "Caption two of img01.png")
    assert by_image["sub dir/last.jpg"] == ("Caption one of sub dir/last.jpg .", "Caption two of sub dir/last.jpg")
    assert run_cli(caption_folder.main, [*argv, "--out", str(tmp_path / "b")]) == 0
    assert read_back(tmp_path / "b") == splits  # same files, options, seed: same split
    assert run_cli(caption_folder.main, [*argv, "--seed", "5", "--out", str(tmp_path / "c")]) == 0
    assert read_back(tmp_path / "c")["valid"] != splits["valid"]
    info = json.loads((tmp_path / "a" / "dataset.json").read_text())
    assert info["options"]["valid"] == 3 and info["options"]["seed"] == 0 and info["counts"]["captions"] == 30
    capsys.readouterr()


def test_caption_folder_default_sizes_and_no_test_split(tmp_path):
    images, captions = write_folder(tmp_path, header=False)
    assert caption_folder.main(["--images", str(images), "--captions", str(captions), "--out", str(tmp_path / "a")]) == 0
    assert [len(items) for items in read_back(tmp_path / "a").values()] == [16, 2, 2]
    assert caption_folder.main(["--images", str(images), "--captions", str(captions), "--out", str(tmp_path / "b"), "--test", "0", "--language", "de"]) == 0
    info = json.loads((tmp_path / "b" / "dataset.json").read_text())
    assert info["splits"] == {"train": 18, "valid": 2} and info["language"] == "de"


def test_caption_folder_missing_images_are_an_error_unless_skipped(tmp_path, capsys):
    images, captions = write_folder(tmp_path)
    for number in range(7):
        (images / f"img{number:02d}.{'png' if number % 2 else 'jpg'}").unlink()
    argv = ["--images", str(images), "--captions", str(captions), "--out", str(tmp_path / "out"), "--valid", "2", "--test", "2"]
    err = fails(caption_folder.main, argv, capsys, "7 of the 20 images", "img00.jpg, img01.png, img02.jpg, img03.png, img04.jpg, ...", "--skip-missing")
    assert "img05.png" not in err
    assert run_cli(caption_folder.main, [*argv, "--skip-missing"]) == 0
    assert "left out 7 images missing" in capsys.readouterr().out
    assert [len(items) for items in read_back(tmp_path / "out").values()] == [9, 2, 2]
    assert json.loads((tmp_path / "out" / "dataset.json").read_text())["counts"]["skipped_missing_files"] == 7


def test_caption_folder_split_lists(tmp_path, capsys):
    images, captions = write_folder(tmp_path)
    lists = {"train": ["img00.jpg", "./img01.png", "img02.jpg", "sub dir/last.jpg"], "valid": ["img03.png", "", "img04.jpg"], "test": ["img05.png"]}
    for name, names in lists.items():
        (tmp_path / f"{name}.txt").write_text("\n".join(names) + "\n")
    argv = ["--images", str(images), "--captions", str(captions), "--out", str(tmp_path / "out")]
    list_argv = [*argv, "--train-list", str(tmp_path / "train.txt"), "--valid-list", str(tmp_path / "valid.txt")]
    assert run_cli(caption_folder.main, [*list_argv, "--test-list", str(tmp_path / "test.txt")]) == 0
    splits = read_back(tmp_path / "out")
    assert {name: images_of(items) for name, items in splits.items()} == {
        "train": ["img00.jpg", "img01.png", "img02.jpg", "sub dir/last.jpg"], "valid": ["img03.png", "img04.jpg"], "test": ["img05.png"]
    }
    assert "13 captioned images are in no list" in capsys.readouterr().out
    assert run_cli(caption_folder.main, list_argv) == 0  # no test list: no test split
    assert json.loads((tmp_path / "out" / "dataset.json").read_text())["splits"] == {"train": 4, "valid": 2}

    (tmp_path / "empty.txt").write_text("\n")
    fails(caption_folder.main, [*list_argv, "--test-list", str(tmp_path / "empty.txt")], capsys, "the test split has no image")
    (tmp_path / "valid.txt").write_text("img03.png\nnot-captioned.jpg\n")
    fails(caption_folder.main, list_argv, capsys, "1 listed images have no caption", "not-captioned.jpg", "--skip-missing")
    (images / "img02.jpg").unlink()
    fails(caption_folder.main, [*list_argv, "--test-list", str(tmp_path / "test.txt")], capsys, "1 listed images have no caption")
    (tmp_path / "valid.txt").write_text("img03.png\n")
    fails(caption_folder.main, list_argv, capsys, "1 of the 4 images in the train list are not in", "img02.jpg")
    assert run_cli(caption_folder.main, [*list_argv, "--skip-missing"]) == 0
    assert json.loads((tmp_path / "out" / "dataset.json").read_text())["counts"]["skipped"]["train"] == {"missing_files": 1, "without_captions": 0}
    (tmp_path / "valid.txt").write_text("img03.png\nimg00.jpg\n")
    fails(caption_folder.main, list_argv, capsys, "img00.jpg is in both the train list and the valid list")
    fails(caption_folder.main, [*argv, "--train-list", str(tmp_path / "train.txt")], capsys, "give --train-list and --valid-list")
    fails(caption_folder.main, [*list_argv, "--valid", "2"], capsys, "--valid set the random split")
    fails(caption_folder.main, [*argv, "--train-list", str(tmp_path / "train.txt"), "--valid-list", str(tmp_path / "none.txt")], capsys,
          "--valid-list file not found")


@pytest.mark.parametrize(
    "lines, options, fragments",
    [
        (["a.jpg\tok", "a.jpg no tab"], [], ["line 2", "expected 'image<TAB>caption', found no tab"]),
        (["a.jpg\t   "], [], ["line 1", "the caption is empty"]),
        (["\tcaption"], [], ["line 1", "the image path is empty"]),
        (["/abs/a.jpg\tx"], [], ["is absolute"]),
        (["a  b.jpg\tx"], [], ["runs of spaces"]),
        (["image\tcaption", ""], [], ["holds no captions"]),
        (["a.jpg\tx"], [], ["1 images leave nothing for training after 1 validation and 0 test"]),
        (["a.jpg\tx", "b.jpg\ty", "c.jpg\tz"], ["--valid", "0"], ["--valid must be at least 1"]),
        (["a.jpg\tx", "b.jpg\ty", "c.jpg\tz"], ["--test", "-1"], ["--test must be 0 or more"]),
        (["a.jpg\tx", "b.jpg\ty", "c.jpg\tz"], ["--valid", "2", "--test", "1"], ["3 images leave nothing for training"]),
    ],
)
def test_caption_folder_bad_inputs_are_one_error(tmp_path, capsys, lines, options, fragments):
    make_images(tmp_path / "photos", "a.jpg", "b.jpg", "c.jpg")
    (tmp_path / "captions.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    argv = ["--images", str(tmp_path / "photos"), "--captions", str(tmp_path / "captions.tsv"), "--out", str(tmp_path / "out"), *options]
    fails(caption_folder.main, argv, capsys, *fragments)
    assert not (tmp_path / "out").exists()


def test_caption_folder_missing_inputs_are_one_error(tmp_path, capsys):
    images, captions = write_folder(tmp_path, count=4)
    fails(caption_folder.main, ["--images", str(images), "--captions", str(tmp_path / "none.tsv"), "--out", str(tmp_path / "o")], capsys,
          "captions file not found")
    fails(caption_folder.main, ["--images", str(tmp_path / "none"), "--captions", str(captions), "--out", str(tmp_path / "o")], capsys,
          "images folder not found")
    (tmp_path / "file").write_text("x")
    fails(caption_folder.main, ["--images", str(images), "--captions", str(captions), "--out", str(tmp_path / "file")], capsys,
          "exists and is not a folder")


def test_an_image_path_a_split_cannot_hold_keeps_the_dataset_already_there(tmp_path):
    """The paths were checked as each split was written, after the folder's dataset.json had gone."""
    from attnkit.data.captions import write_caption_dataset
    from attnkit.errors import UserError

    good = {"train": [CaptionedImage("a.jpg", ("a cat",))], "valid": [CaptionedImage("b.jpg", ("a dog",))]}
    write_caption_dataset(tmp_path / "out", good, tmp_path)
    before = {path.name: path.read_bytes() for path in (tmp_path / "out").iterdir()}
    bad = {**good, "test": [CaptionedImage("c\td.jpg", ("a tab",))]}
    with pytest.raises(UserError, match="split 'test': image path"):
        write_caption_dataset(tmp_path / "out", bad, tmp_path)
    assert {path.name: path.read_bytes() for path in (tmp_path / "out").iterdir()} == before
