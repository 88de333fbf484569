"""Synthetic scenes with ground truth for grounding attention in both modalities.

A scene is a small RGB image of one to three objects (shape x colour x size) on a
textured background, placed on a 3 x 3 layout of slots with some jitter, together
with the sentences that describe it in English and in French. Everything the
attention can be scored against comes with it:

* each object's bounding box (pixels);
* for every English word, the object it names (size, colour and shape words; the
  other words name none);
* gold word alignments between the French and the English sentence, as *sure*
  links (each English word has at most one) and *possible* links (a superset), the
  two sets the alignment error rate reads (Och and Ney 2003).

French puts the colour after the noun ("un grand cercle rouge" for "a large red
circle"), so alignments cross. Several phrasings describe the same scene ("a red
circle to the left of a blue square", "a blue square to the right of a red circle",
"there is ..."); all of them are references for captioning, and each is one
translation pair.

Scenes are deterministic from a seed; image pixels too (numpy noise seeded per
scene). The **compositional split** holds the colour-shape pairs in ``HELD_OUT``:
they never appear in the train, valid or test splits and appear in every scene of
the ``compositional`` split.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from attnkit.data.captions import CaptionedImage, write_caption_dataset
from attnkit.data.folder import read_dataset_info, writing_datasets
from attnkit.data.text import write_parallel_dataset
from attnkit.errors import UserError
from attnkit.files import json_text

TASK = "scenes"
# English name -> (French name, grammatical gender)
SHAPES = {"circle": ("cercle", "m"), "square": ("carré", "m"), "triangle": ("triangle", "m"), "star": ("étoile", "f")}
# English name -> ((French masculine, feminine), RGB)
COLOURS = {
    "red": (("rouge", "rouge"), (215, 35, 35)),
    "green": (("vert", "verte"), (40, 170, 60)),
    "blue": (("bleu", "bleue"), (40, 80, 220)),
    "yellow": (("jaune", "jaune"), (235, 210, 40)),
    "purple": (("violet", "violette"), (150, 50, 180)),
    "white": (("blanc", "blanche"), (245, 245, 245)),
}
SIZES = {"small": ("petit", "petite"), "large": ("grand", "grande")}
ARTICLES = {"m": "un", "f": "une"}
# Each shape and each colour stays in training with other partners; these pairs appear only in the compositional split.
HELD_OUT = frozenset({("red", "square"), ("green", "circle"), ("blue", "triangle"), ("yellow", "star")})
SPLITS = ("train", "valid", "test", "compositional")
LAYOUT = 3  # slots per side
OBJECT_COUNTS = (1, 2, 3)
OBJECT_COUNT_WEIGHTS = (0.25, 0.45, 0.30)


@dataclass(frozen=True)
class SceneObject:
    shape: str
    colour: str
    size: str  # small | large
    slot: tuple[int, int]  # (column, row) on the LAYOUT x LAYOUT layout
    box: tuple[int, int, int, int]  # (x0, y0, x1, y1) pixels, x1 and y1 exclusive: the square the shape is drawn in

    @cached_property
    def drawn_box(self) -> tuple[int, int, int, int]:
        """The box of the pixels the shape covers (x1 and y1 exclusive): the gold that pointing, in-box mass and
        attention supervision score against. A circle and a triangle fill ``box``; a square is drawn inset (8 % a
        side) and a star's lowest points lie at 0.81 of its radius, so their ``box`` held cells with none of the
        shape (a square's 6.8 cells against 5.2 on the 8 x 8 grid)."""
        x0, y0, x1, y1 = self.box
        mask = Image.new("1", (x1 + 1, y1 + 1))  # the shape alone, at its place (the box never leaves the image)
        _draw_shape(ImageDraw.Draw(mask), self.shape, self.box, 1)
        return mask.getbbox()


@dataclass(frozen=True)
class Sentence:
    """One phrasing of a scene in both languages, with its ground truth."""

    english: tuple[str, ...]
    french: tuple[str, ...]
    referents: tuple[int | None, ...]  # per English word: index of the object it names, or None
    sure: tuple[tuple[int, int], ...]  # (french index, english index) links; at most one per English word
    possible: tuple[tuple[int, int], ...]  # sure links plus the plausible extra ones

    @property
    def english_text(self) -> str:
        return " ".join(self.english)

    @property
    def french_text(self) -> str:
        return " ".join(self.french)


@dataclass(frozen=True)
class Scene:
    objects: tuple[SceneObject, ...]
    sentences: tuple[Sentence, ...]  # every phrasing; the first is the canonical one
    size: int  # image side in pixels
    seed: int  # seeds the background texture

    def image(self) -> Image.Image:
        return render(self)


# -- sentences -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Piece:
    english: tuple[str, ...]
    french: tuple[str, ...]
    sure: tuple[tuple[int, int], ...] = ()  # (french, english) within the piece
    possible: tuple[tuple[int, int], ...] = ()  # extra possible links within the piece
    referent: int | None = None  # object named by the piece's content words


def _object_piece(index: int, item: SceneObject) -> _Piece:
    noun, gender = SHAPES[item.shape]
    colour = COLOURS[item.colour][0][gender == "f"]
    size = SIZES[item.size][gender == "f"]
    # a large red circle -> un grand cercle rouge: the colour moves behind the noun
    return _Piece(("a", item.size, item.colour, item.shape), (ARTICLES[gender], size, noun, colour), ((0, 0), (1, 1), (3, 2), (2, 3)), (), index)


RELATIONS = {
    "left": _Piece(("to", "the", "left", "of"), ("à", "gauche", "d'"), ((0, 0), (1, 2), (2, 3)), ((0, 1),)),
    "right": _Piece(("to", "the", "right", "of"), ("à", "droite", "d'"), ((0, 0), (1, 2), (2, 3)), ((0, 1),)),
    "above": _Piece(("above",), ("au-dessus", "d'"), ((0, 0),), ((1, 0),)),
    "below": _Piece(("below",), ("en", "dessous", "d'"), ((1, 0),), ((0, 0), (2, 0))),
}
INVERSE = {"left": "right", "right": "left", "above": "below", "below": "above"}
THERE_IS = _Piece(("there", "is"), ("il", "y", "a"), ((0, 0), (2, 1)), ((1, 0),))
AND = _Piece(("and",), ("et",), ((0, 0),))


def _join(pieces: Iterable[_Piece]) -> Sentence:
    english: list[str] = []
    french: list[str] = []
    referents: list[int | None] = []
    sure: list[tuple[int, int]] = []
    possible: list[tuple[int, int]] = []
    for piece in pieces:
        f0, e0 = len(french), len(english)
        english += piece.english
        french += piece.french
        # Articles name no object: the pointing game scores size, colour and shape words.
        referents += [None if piece.referent is None or word == "a" else piece.referent for word in piece.english]
        sure += [(f0 + f, e0 + e) for f, e in piece.sure]
        possible += [(f0 + f, e0 + e) for f, e in (*piece.sure, *piece.possible)]
    return Sentence(tuple(english), tuple(french), tuple(referents), tuple(sure), tuple(sorted(set(possible))))


def relation(first: SceneObject, second: SceneObject) -> str:
    """Where ``first`` is with respect to ``second``: left / right when their columns differ, else above / below."""
    (c1, r1), (c2, r2) = first.slot, second.slot
    if c1 != c2:
        return "left" if c1 < c2 else "right"
    return "above" if r1 < r2 else "below"


def describe(objects: Sequence[SceneObject]) -> tuple[Sentence, ...]:
    """Every phrasing of a scene; objects are named in reading order (column, then row)."""
    order = sorted(range(len(objects)), key=lambda i: objects[i].slot)
    named = {i: _object_piece(i, objects[i]) for i in order}
    if len(order) == 1:
        (a,) = order
        return _join([named[a]]), _join([THERE_IS, named[a]])
    a, b, *rest = order
    forward = RELATIONS[relation(objects[a], objects[b])]
    backward = RELATIONS[INVERSE[relation(objects[a], objects[b])]]
    tail = [AND, named[rest[0]]] if rest else []
    return (
        _join([named[a], forward, named[b], *tail]),
        _join([named[b], backward, named[a], *tail]),
        _join([THERE_IS, named[a], forward, named[b], *tail]),
    )


def word_kind(word: str) -> str:
    """An English scene word's kind, to break grounding down by: size, colour, shape, or the word itself."""
    return "size" if word in SIZES else "colour" if word in COLOURS else "shape" if word in SHAPES else word


# The kinds of word that carry a scene's content: what an object is and where it is. The rest ("a", "the", "of",
# "to", "there", "is", "and") frame it; a frame word loses little when its French word is hidden, since the
# sentence's shape predicts it, so scores over content words keep that effect apart.
CONTENT_KINDS = ("size", "colour", "shape", *RELATIONS)


# -- scenes ----------------------------------------------------------------------------------------------
def allowed_pairs(split: str) -> list[tuple[str, str]]:
    pairs = [(colour, shape) for colour in COLOURS for shape in SHAPES]
    return [p for p in pairs if p not in HELD_OUT] if split != "compositional" else pairs


def generate_scene(rng: random.Random, split: str = "train", size: int = 128) -> Scene:
    """One random scene; ``split`` decides which colour-shape pairs may appear (see HELD_OUT)."""
    if split not in SPLITS:
        raise UserError(f"unknown scene split '{split}'; choose one of {', '.join(SPLITS)}")
    count = rng.choices(OBJECT_COUNTS, OBJECT_COUNT_WEIGHTS)[0]
    slots = rng.sample([(c, r) for c in range(LAYOUT) for r in range(LAYOUT)], count)
    pairs = [rng.choice(allowed_pairs(split)) for _ in range(count)]
    if split == "compositional":
        pairs[rng.randrange(count)] = rng.choice(sorted(HELD_OUT))
    objects = []
    cell = size / LAYOUT
    for (colour, shape), slot in zip(pairs, slots):
        object_size = rng.choice(tuple(SIZES))
        radius = round(size * (0.13 if object_size == "large" else 0.08))
        jitter = round(size * 0.025)
        cx = round((slot[0] + 0.5) * cell) + rng.randint(-jitter, jitter)
        cy = round((slot[1] + 0.5) * cell) + rng.randint(-jitter, jitter)
        objects.append(SceneObject(shape, colour, object_size, slot, (cx - radius, cy - radius, cx + radius, cy + radius)))
    objects = tuple(objects)
    return Scene(objects, describe(objects), size, rng.randrange(2**31))


def generate_scenes(count: int, seed: int = 0, split: str = "train", size: int = 128) -> list[Scene]:
    """``count`` scenes of ``split``; each split has its own random stream, so splits never share scenes by seed."""
    rng = random.Random(f"attnkit-scenes-{seed}-{split}")
    return [generate_scene(rng, split, size) for _ in range(count)]


def render(scene: Scene) -> Image.Image:
    """The scene's image: objects drawn over a noisy, softly coloured background (deterministic)."""
    noise = np.random.default_rng(scene.seed)
    size = scene.size
    tint = noise.uniform(80, 150) + noise.uniform(-12, 12, size=3)  # (3,) greyish: no background passes for an object colour
    ramp = np.linspace(-20, 20, size)[None, :, None] * noise.choice([-1, 1])  # (1, W, 1) a gentle left-right gradient
    pixels = tint + ramp + noise.normal(0, 18, size=(size, size, 3))  # (H, W, 3)
    image = Image.fromarray(pixels.clip(0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    for item in scene.objects:
        _draw_shape(draw, item.shape, item.box, COLOURS[item.colour][1])
    return image


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, box: tuple[int, int, int, int], fill) -> None:
    """One shape in the square ``box`` (what :func:`render` draws, and :attr:`SceneObject.drawn_box` measures)."""
    x0, y0, x1, y1 = box
    if shape == "circle":
        draw.ellipse((x0, y0, x1 - 1, y1 - 1), fill=fill)
    elif shape == "square":
        inset = round((x1 - x0) * 0.08)  # a square as wide as a circle looks bigger: shrink it a little
        draw.rectangle((x0 + inset, y0 + inset, x1 - 1 - inset, y1 - 1 - inset), fill=fill)
    elif shape == "triangle":
        draw.polygon([(x0, y1 - 1), (x1 - 1, y1 - 1), ((x0 + x1) / 2, y0)], fill=fill)
    else:
        draw.polygon(_star(x0, y0, x1, y1), fill=fill)


def _star(x0: float, y0: float, x1: float, y1: float) -> list[tuple[float, float]]:
    cx, cy, outer = (x0 + x1) / 2, (y0 + y1) / 2, (x1 - x0) / 2
    points = []
    for k in range(10):
        angle = np.pi / 2 + k * np.pi / 5
        radius = outer if k % 2 == 0 else outer * 0.45
        points.append((cx + radius * np.cos(angle), cy - radius * np.sin(angle)))
    return points


# -- on disk ---------------------------------------------------------------------------------------------
def write_scene_dataset(folder: str | Path, counts: Mapping[str, int], seed: int = 0, size: int = 128) -> Path:
    """Generate scenes and write them as one folder that both tasks read::

        images/<split>-<n>.png
        captions/        captioning dataset: every English phrasing of a scene is a reference
        text/            French -> English parallel text: one pair per phrasing
        <split>.jsonl    ground truth per scene: objects, sentences, referents, alignments
        dataset.json     task "scenes", seed, counts, held-out pairs (written last)
    """
    folder = Path(folder)
    for split in counts:
        if split not in SPLITS:
            raise UserError(f"unknown scene split '{split}'; choose from {', '.join(SPLITS)}")
    images = folder / "images"
    try:
        # One swap for the three datasets and the images that all three read: a run cut short leaves the old
        # scenes whole, and a finished one never pairs new images with old captions.
        with writing_datasets() as write:
            captioned: dict[str, list[CaptionedImage]] = {}
            pairs: dict[str, list[tuple[str, str]]] = {}
            for split, count in counts.items():
                scenes = generate_scenes(count, seed, split, size)
                captioned[split], pairs[split], truth = [], [], []
                for number, scene in enumerate(scenes):
                    name = f"{split}-{number:05d}.png"
                    write.save_image(images / name, scene.image())
                    captioned[split].append(CaptionedImage(name, tuple(s.english_text for s in scene.sentences)))
                    pairs[split] += [(s.french_text, s.english_text) for s in scene.sentences]
                    truth.append(json_text({"image": name, **scene_to_dict(scene)}))
                write.write_text(folder / f"{split}.jsonl", "".join(line + "\n" for line in truth))
            info = {"source": "generated by attnkit.data.scenes", "seed": seed, "image_size": size}
            write_caption_dataset(folder / "captions", captioned, images, "en", info={"name": "scenes", **info}, into=write)
            write_parallel_dataset(folder / "text", ("fr", "en"), pairs, info={"name": "scenes", **info}, into=write)
            write.info(folder, {"task": TASK, "splits": dict(counts), "held_out_pairs": sorted(map(list, HELD_OUT)), **info})
    except OSError as error:
        raise UserError(f"cannot write the scene folder {folder}: {error}") from None
    return folder


def scene_to_dict(scene: Scene) -> dict:
    return asdict(scene)


def scene_from_dict(values: Mapping) -> Scene:
    objects = tuple(SceneObject(o["shape"], o["colour"], o["size"], tuple(o["slot"]), tuple(o["box"])) for o in values["objects"])
    sentences = tuple(
        Sentence(tuple(s["english"]), tuple(s["french"]), tuple(s["referents"]), tuple(map(tuple, s["sure"])), tuple(map(tuple, s["possible"])))
        for s in values["sentences"]
    )
    return Scene(objects, sentences, int(values["size"]), int(values["seed"]))


def read_scene_split(folder: str | Path, split: str) -> list[tuple[str, Scene]]:
    """(image file name, scene) for every scene of a split written by :func:`write_scene_dataset`."""
    folder = Path(folder)
    read_dataset_info(folder, task=TASK)
    path = folder / f"{split}.jsonl"
    if not path.is_file():
        raise UserError(f"{folder} has no scene split '{split}' (missing {path.name})")
    scenes = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                values = json.loads(line)
                scenes.append((values["image"], scene_from_dict(values)))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
                raise UserError(f"{path}:{number}: not a scene record ({error})") from None
    return scenes
