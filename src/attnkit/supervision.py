"""Attention supervision: where each training word's attention should go (the loss that pulls it there: :func:`attnkit.losses.supervision_loss`).

``train.attention_supervision`` (a weight; 0, the default, is off) adds to the training loss,
for every target word with gold positions, KL(gold || attention) of the step that *emits* the
word (the extraction ``compare`` reads by default). Words without gold positions add nothing.
This is guided alignment training for text (Chen et al. 2016; Garg et al. 2019) and supervised
captioning attention for images (Liu et al. 2017), through one loss.

Where gold positions come from: the generated scenes (:mod:`attnkit.data.scenes`) write their
ground truth beside the two datasets they make (``<scenes>/train.jsonl`` next to
``<scenes>/captions`` and ``<scenes>/text``). A caption word that names an object gets the grid
cells its box overlaps, weighted by the share of each cell inside the box; an English word with a
sure link to a French word gets that word. Other datasets have no gold attention; asking for
supervision on them is an error.

Legend: B batch, T target steps, L memory positions, N gold entries of a batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from torch import Tensor

from attnkit.analysis import cell_boxes, overlap_share
from attnkit.data.batching import ExampleGold
from attnkit.data.folder import INFO_FILE, read_dataset_info
from attnkit.data.scenes import TASK as SCENES, Scene, read_scene_split
from attnkit.errors import UserError

CaptionGold = Callable[[str, Sequence[str]], "ExampleGold | None"]  # (image, caption words) -> gold
TranslationGold = Callable[[Sequence[str], Sequence[str]], "ExampleGold | None"]  # (source words, target words) -> gold


def scene_ground_truth(dataset_folder: str | Path, option: str = "train.attention_supervision") -> list[tuple[str, Scene]]:
    """The training scenes whose folder holds ``dataset_folder`` (a scene folder's ``captions`` or ``text``)."""
    folder = Path(dataset_folder).parent
    info = read_dataset_info(folder) if (folder / INFO_FILE).is_file() else {}
    if info.get("task") != SCENES:
        raise UserError(
            f"{option} needs gold attention, and {dataset_folder} has none: it is not part of a scene folder "
            "(data_scripts/make_scenes.py writes one, with its ground truth in train.jsonl)"
        )
    return read_scene_split(folder, "train")


def caption_gold(scenes: Sequence[tuple[str, Scene]], grid: tuple[int, int]) -> CaptionGold:
    """For a caption of an image (as tokens), the cells of each referring word's object, by overlap."""
    by_caption: dict[tuple[str, tuple[str, ...]], ExampleGold] = {}
    for image, scene in scenes:
        cells = cell_boxes(grid, (scene.size, scene.size))  # (L, 4)
        object_cells = [_cells_of(overlap_share(cells, item.drawn_box)) for item in scene.objects]  # the pixels each shape covers
        for sentence in scene.sentences:
            entries = []
            for step, referent in enumerate(sentence.referents):
                if referent is not None:
                    entries += [(step, cell, weight) for cell, weight in object_cells[referent]]
            by_caption[image, sentence.english] = tuple(entries)
    return lambda image, words: by_caption.get((image, tuple(words)))


def _cells_of(share: Tensor) -> list[tuple[int, float]]:
    """The (cell, weight) pairs of an object's overlap shares (L,), the weights normalised to a distribution; read
    to the host once per object (not once per cell: a demo's captions name objects some 35,000 times)."""
    share = share / share.sum()  # (L,)
    cells = share.nonzero().flatten()  # (cells the object overlaps,)
    return list(zip(cells.tolist(), share[cells].tolist()))


def translation_gold(scenes: Sequence[tuple[str, Scene]]) -> TranslationGold:
    """For a (French, English) pair (as tokens), each English word's sure-linked French word."""
    by_pair: dict[tuple[tuple[str, ...], tuple[str, ...]], ExampleGold] = {}
    for _, scene in scenes:
        for sentence in scene.sentences:
            by_pair[sentence.french, sentence.english] = tuple((english, french, 1.0) for french, english in sorted(sentence.sure, key=lambda link: link[1]))
    return lambda source, target: by_pair.get((tuple(source), tuple(target)))


def require_gold(golds: Sequence[ExampleGold | None], what: str, hint: str) -> None:
    """A clear error when supervision was asked for and no training example of ``what`` has gold attention."""
    if not any(golds):
        raise UserError(f"train.attention_supervision: none of the {what} matches the scenes' ground truth ({hint})")


def describe_gold(golds: Sequence[ExampleGold | None] | None, what: str) -> list[str]:
    """A line for the training log: how many examples and words the supervision reaches (none without it)."""
    if golds is None:
        return []
    words = sum(len({step for step, _, _ in gold}) for gold in golds if gold)
    return [f"attention supervision: {sum(1 for gold in golds if gold):,} of {len(golds):,} {what} have gold attention ({words:,} words)"]
