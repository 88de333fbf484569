"""Padding, collation and length-bucketed batching.

Legend: B batch, S source length, T target length (with <bos>/<eos>).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attnkit.interfaces import PaddedTokens, Source


def pad_sequences(sequences: Sequence[Sequence[int]], pad_index: int = 0) -> PaddedTokens:
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)
    ids = torch.full((len(sequences), int(lengths.max()) if len(sequences) else 0), pad_index, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = torch.as_tensor(sequence, dtype=torch.long)
    return PaddedTokens(ids, lengths)  # (B, S), (B,)


@dataclass(frozen=True)
class GoldAttention:
    """Where a batch's attention should go (attention supervision), sparse: ``weights[k]`` at
    (row, step, memory position) ``indices[k]``; every other (row, step) has no gold."""

    indices: Tensor  # (N, 3) long
    weights: Tensor  # (N,)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "GoldAttention":
        return GoldAttention(self.indices.to(device, non_blocking=non_blocking), self.weights.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "GoldAttention":
        return GoldAttention(self.indices.pin_memory(), self.weights.pin_memory())

    def dense(self, like: Tensor) -> Tensor:
        """As a tensor shaped like the attention ``like`` (B, T, L): a distribution per step with gold, zeros elsewhere."""
        gold = torch.zeros(like.shape, dtype=torch.float, device=like.device)
        return gold.index_put_(tuple(self.indices.T), self.weights.to(like.device))


# One training example's gold attention: (target word position, memory position, weight); the
# weights of a word sum to 1. Word position t is the word the decoder's step t emits.
ExampleGold = tuple[tuple[int, int, float], ...]


def batch_gold(golds: Sequence[ExampleGold | None]) -> GoldAttention | None:
    """The sparse gold attention of a batch of examples (None when none of them has any)."""
    entries = [(row, step, position, weight) for row, gold in enumerate(golds) for step, position, weight in gold or ()]
    if not entries:
        return None
    rows, steps, positions, weights = zip(*entries)
    return GoldAttention(torch.tensor([rows, steps, positions], dtype=torch.long).T.contiguous(), torch.tensor(weights, dtype=torch.float))  # (N, 3), (N,)


@dataclass(frozen=True)
class Batch:
    """One training or evaluation batch; ``source`` is whatever the encoder takes."""

    source: Source  # PaddedTokens for text, Pixels or GridFeatures for images
    target: Tensor | None  # (B, T) <bos> w1 ... <eos> <pad>..., or None when decoding without references
    index: Tensor  # (B,) positions of the examples in their dataset
    attention_gold: GoldAttention | None = None  # training with attention supervision only

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Batch":
        return Batch(
            self.source.to(device, non_blocking=non_blocking),
            None if self.target is None else self.target.to(device, non_blocking=non_blocking),
            self.index,
            None if self.attention_gold is None else self.attention_gold.to(device, non_blocking=non_blocking),
        )

    def pin_memory(self) -> "Batch":
        return Batch(
            self.source.pin_memory(),
            None if self.target is None else self.target.pin_memory(),
            self.index,
            None if self.attention_gold is None else self.attention_gold.pin_memory(),
        )


class BucketBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Batches of similar length: shuffle, sort within pools of ``pool_factor`` batches, cut, shuffle batches.

    Similar lengths waste little compute on padding; the pools keep epochs random.
    ``lengths`` holds one sort key per example: a length, or a tuple such as
    (target length, source length).
    """

    def __init__(self, lengths: Sequence[Any], batch_size: int, shuffle: bool = True, pool_factor: int = 50, seed: int = 0):
        self.lengths = list(lengths)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.pool_size = batch_size * pool_factor
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _batches(self) -> list[list[int]]:
        rng = random.Random(self.seed + self.epoch)
        order = list(range(len(self.lengths)))
        if self.shuffle:
            rng.shuffle(order)
        batches = []
        for start in range(0, len(order), self.pool_size):
            pool = sorted(order[start : start + self.pool_size], key=self.lengths.__getitem__)
            batches += [pool[i : i + self.batch_size] for i in range(0, len(pool), self.batch_size)]
        if self.shuffle:
            rng.shuffle(batches)
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._batches())

    def __len__(self) -> int:
        return (len(self.lengths) + self.batch_size - 1) // self.batch_size if self.lengths else 0


class TaskMixSampler(torch.utils.data.Sampler[list[int]]):
    """Batches of several tasks, each batch from one task, interleaved at random with fixed shares.

    ``samplers`` give each task's batches as indices into that task's dataset;
    ``offsets`` shift them into a dataset that concatenates the tasks' datasets. An
    epoch has as many batches as all tasks together; each batch is drawn from task
    ``k`` with probability ``shares[k]``, and a task whose batches run out starts
    over on a fresh shuffle, so a small task is repeated rather than starved.
    """

    def __init__(self, samplers: Sequence[BucketBatchSampler], offsets: Sequence[int], shares: Sequence[float], seed: int = 0):
        if len(samplers) != len(offsets) or len(samplers) != len(shares) or any(s < 0 for s in shares) or sum(shares) <= 0:
            raise ValueError("one offset and one non-negative share per task, shares not all zero")
        if any(share > 0 and len(sampler) == 0 for sampler, share in zip(samplers, shares)):
            raise ValueError("a task with a positive share has no batches")
        self.samplers, self.offsets, self.shares = list(samplers), list(offsets), list(shares)
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return sum(len(sampler) for sampler, share in zip(self.samplers, self.shares) if share > 0)

    def __iter__(self) -> Iterator[list[int]]:
        rng = random.Random(f"{self.seed}-{self.epoch}")
        streams = [self._stream(task) for task in range(len(self.samplers))]
        for task in rng.choices(range(len(self.samplers)), weights=self.shares, k=len(self)):
            yield next(streams[task])

    def _stream(self, task: int) -> Iterator[list[int]]:
        sampler, offset = self.samplers[task], self.offsets[task]
        for cycle in itertools.count():
            sampler.set_epoch(self.epoch * 1000 + cycle)
            for batch in sampler:
                yield [offset + i for i in batch]
