import itertools

import pytest

from attnkit.data.captions import image_root, read_caption_split
from attnkit.data.scenes import (
    COLOURS,
    HELD_OUT,
    SHAPES,
    SIZES,
    generate_scenes,
    read_scene_split,
    relation,
    word_kind,
    write_scene_dataset,
)
from attnkit.data.text import read_parallel
from attnkit.errors import UserError

SPLITS = ("train", "valid", "test", "compositional")


def test_scenes_are_deterministic_from_the_seed():
    first, again, other = generate_scenes(20, seed=3), generate_scenes(20, seed=3), generate_scenes(20, seed=4)
    assert first == again and first != other
    assert all(a.image().tobytes() == b.image().tobytes() for a, b in zip(first[:3], again[:3]))


@pytest.mark.parametrize("split", SPLITS)
def test_boxes_lie_inside_the_image_and_objects_do_not_overlap(split):
    for scene in generate_scenes(200, seed=1, split=split):
        assert 1 <= len(scene.objects) <= 3
        for item in scene.objects:
            x0, y0, x1, y1 = item.box
            assert 0 <= x0 < x1 <= scene.size and 0 <= y0 < y1 <= scene.size
        for a, b in itertools.combinations(scene.objects, 2):
            apart_x = a.box[2] <= b.box[0] or b.box[2] <= a.box[0]
            apart_y = a.box[3] <= b.box[1] or b.box[3] <= a.box[1]
            assert apart_x or apart_y


def test_the_gold_box_is_the_box_of_the_pixels_the_shape_covers():
    """Squares are drawn inset in their square and a star's lowest points lie above its box's edge: the gold box was
    the square drawn in, so a square named 6.8 cells of the 8 x 8 grid where 5.2 held any of it."""
    import numpy as np

    from attnkit.data.scenes import COLOURS

    shrunk = set()
    for scene in generate_scenes(100, seed=0, split="test"):
        pixels = np.asarray(scene.image())
        for item in scene.objects:
            x0, y0, x1, y1 = item.box
            ys, xs = np.nonzero((pixels[y0:y1, x0:x1] == COLOURS[item.colour][1]).all(-1))  # the object's own colour
            assert item.drawn_box == (x0 + xs.min(), y0 + ys.min(), x0 + xs.max() + 1, y0 + ys.max() + 1), (item.shape, item.box)
            shrunk |= {item.shape} if item.drawn_box != item.box else set()
    assert shrunk == {"square", "star"}


def test_every_referring_word_names_an_object_with_that_attribute():
    for scene in generate_scenes(200, seed=2):
        for sentence in scene.sentences:
            assert len(sentence.referents) == len(sentence.english)
            for word, referent in zip(sentence.english, sentence.referents):
                if word in SHAPES or word in COLOURS or word in SIZES:
                    assert referent is not None, (word, sentence.english_text)
                    assert word_kind(word) in ("shape", "colour", "size")
                    named = scene.objects[referent]
                    assert word in (named.shape, named.colour, named.size)
                else:
                    assert referent is None and word_kind(word) == word
            mentioned = {r for r in sentence.referents if r is not None}
            assert mentioned == set(range(len(scene.objects)))  # every object is described


def test_alignments_index_both_sentences_and_sure_links_are_possible():
    crossing = 0
    for scene in generate_scenes(200, seed=5):
        for sentence in scene.sentences:
            assert set(sentence.sure) <= set(sentence.possible)
            for source, target in sentence.possible:
                assert 0 <= source < len(sentence.french) and 0 <= target < len(sentence.english)
            targets = [t for _, t in sentence.sure]
            assert len(targets) == len(set(targets))  # at most one sure link per English word
            # Sure links join translations of each other: spot-check content words.
            for source, target in sentence.sure:
                english, french = sentence.english[target], sentence.french[source]
                if english in SHAPES:
                    assert french == SHAPES[english][0]
                if english in COLOURS:
                    assert french in COLOURS[english][0]
            links = sorted(sentence.sure, key=lambda link: link[1])
            crossing += any(a[0] > b[0] for a, b in zip(links, links[1:]))
    assert crossing > 0  # French word order differs: "cercle rouge" for "red circle"


def test_phrasings_agree_with_the_layout():
    for scene in generate_scenes(100, seed=6):
        if len(scene.objects) < 2:
            continue
        canonical = scene.sentences[0].english_text
        first, second = sorted(scene.objects, key=lambda o: o.slot)[:2]
        words = {"left": "to the left of", "right": "to the right of", "above": "above", "below": "below"}
        assert words[relation(first, second)] in canonical


def test_compositional_pairs_never_appear_outside_their_split():
    for split in ("train", "valid", "test"):
        for scene in generate_scenes(300, seed=7, split=split):
            assert not any((o.colour, o.shape) in HELD_OUT for o in scene.objects)
    for scene in generate_scenes(100, seed=7, split="compositional"):
        assert any((o.colour, o.shape) in HELD_OUT for o in scene.objects)


def test_written_scenes_are_a_captioning_and_a_translation_dataset(tmp_path):
    folder = write_scene_dataset(tmp_path / "scenes", {"train": 6, "test": 3}, seed=0, size=64)
    items = read_caption_split(folder / "captions", "train")
    assert len(items) == 6 and all((image_root(folder / "captions") / item.image).is_file() for item in items)
    scenes = read_scene_split(folder, "train")
    assert [s.sentences[0].english_text for _, s in scenes] == [item.captions[0] for item in items]
    pairs = read_parallel(folder / "text", "test", "fr", "en")
    assert len(pairs) == sum(len(s.sentences) for _, s in read_scene_split(folder, "test"))
    with pytest.raises(UserError, match="no scene split 'valid'"):
        read_scene_split(folder, "valid")
    with pytest.raises(UserError, match="unknown scene split"):
        write_scene_dataset(tmp_path / "bad", {"dev": 1})
