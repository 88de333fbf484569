"""Parallel text: the on-disk dataset format and its PyTorch dataset.

A prepared translation dataset is a folder (written by ``data_scripts/``)::

    dataset.json          {"task": "translation", "languages": ["fr", "en"], "splits": {...}, ...}
    train.fr  train.en    raw UTF-8 sentences, one per line; line i of both files is a pair
    valid.fr  valid.en
    test.fr   test.en

Text stays raw on disk; tokenisation happens in attnkit with the run's config,
so the checkpoint knows how to tokenise new input exactly as in training.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from attnkit.data.batching import Batch, batch_gold, pad_sequences
from attnkit.data.folder import INFO_FILE, DatasetWrite, check_split_listed, read_dataset_info, writing_datasets
from attnkit.errors import UserError
from attnkit.files import read_text_file

def write_parallel_dataset(
    folder: str | Path,
    languages: tuple[str, str],
    splits: Mapping[str, Sequence[tuple[str, str]]],
    info: Mapping[str, object] | None = None,
    into: DatasetWrite | None = None,
) -> Path:
    """Write ``splits`` (name -> [(source, target), ...]) as a dataset folder: the old one stays whole until every
    new file is written (:class:`~attnkit.data.folder.DatasetWrite`; ``into``: with a caller's files)."""
    folder = Path(folder)
    meta = {"task": "translation", "languages": list(languages), "splits": {k: len(v) for k, v in splits.items()}, **(info or {})}
    try:
        with writing_datasets(into) as write:
            for name, pairs in splits.items():
                for side, lang in enumerate(languages):
                    lines = [pair[side].replace("\n", " ").strip() for pair in pairs]
                    write.write_text(folder / f"{name}.{lang}", "".join(line + "\n" for line in lines))
            write.info(folder, meta)
    except OSError as error:
        raise UserError(f"cannot write the dataset folder {folder}: {error}") from None
    return folder


def resolve_languages(folder: str | Path, source_lang: str = "", target_lang: str = "") -> tuple[str, str]:
    """The (source, target) pair to use: the config's, else the folder's declared order."""
    info = read_dataset_info(folder, task="translation")
    languages = info.get("languages")
    if not (isinstance(languages, list) and len(languages) >= 2 and all(isinstance(lang, str) and lang for lang in languages)):
        raise UserError(f"{Path(folder) / INFO_FILE}: \"languages\" must list the dataset's two languages, e.g. [\"fr\", \"en\"]")
    source = source_lang or languages[0]
    target = target_lang or languages[1]
    for lang in (source, target):
        if lang not in languages:
            raise UserError(f"{folder} has no language '{lang}'; it has {', '.join(languages)}")
    if source == target:
        raise UserError(f"source and target language are both '{source}'")
    return source, target


def read_parallel(folder: str | Path, split: str, source_lang: str, target_lang: str) -> list[tuple[str, str]]:
    """Raw (source, target) sentence pairs of one split."""
    folder = Path(folder)
    check_split_listed(folder, read_dataset_info(folder, task="translation"), split)
    sides = []
    for lang in (source_lang, target_lang):
        path = folder / f"{split}.{lang}"
        if not path.is_file():
            raise UserError(f"{folder} has no split '{split}' for language '{lang}' (missing {path.name})")
        sides.append(read_lines(path))
    if len(sides[0]) != len(sides[1]):
        raise UserError(f"{folder}: {split}.{source_lang} has {len(sides[0])} lines but {split}.{target_lang} has {len(sides[1])}")
    return list(zip(*sides))


def read_lines(path: str | Path) -> list[str]:
    """Lines of a UTF-8 text file, without newlines; a clear error when it is missing or not text."""
    text = read_text_file(path)
    # Split on "\n" only: str.splitlines() also breaks on \x0b, \x85, \u2028 ..., which can occur
    # inside a sentence and would pull two line-aligned files out of step.
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


class ParallelTextDataset(torch.utils.data.Dataset):
    """Encoded pairs: source ids (no specials) and target ids (<bos> ... <eos>), and, for attention
    supervision, each pair's gold attention (see :mod:`attnkit.supervision`)."""

    def __init__(self, source_ids: Sequence[Sequence[int]], target_ids: Sequence[Sequence[int]], gold: Sequence | None = None):
        assert len(source_ids) == len(target_ids) and (gold is None or len(gold) == len(source_ids))
        self.source_ids = list(source_ids)
        self.target_ids = list(target_ids)
        self.gold = None if gold is None else list(gold)

    def __len__(self) -> int:
        return len(self.source_ids)

    def __getitem__(self, index: int) -> tuple[int, Sequence[int], Sequence[int]]:
        return index, self.source_ids[index], self.target_ids[index]

    @property
    def lengths(self) -> list[tuple[int, int]]:
        """Sort key for bucketing: target length, then source length.

        Target first because the decoder and its output layer cost the most per
        step; the batches then carry almost no target padding and little source padding.
        """
        return [(len(t), len(s)) for s, t in zip(self.source_ids, self.target_ids)]


def collate_pairs(examples: Sequence[tuple[int, Sequence[int], Sequence[int]]], gold: Sequence | None = None) -> Batch:
    """``gold``: the dataset's gold attention per example (attention supervision), else None."""
    index, sources, targets = zip(*examples)
    attention_gold = None if gold is None else batch_gold([gold[i] for i in index])
    return Batch(pad_sequences(sources), pad_sequences(targets).ids, torch.tensor(index), attention_gold)  # (B, S), (B, T)
