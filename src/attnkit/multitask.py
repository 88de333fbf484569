"""The joint task: one decoder learns to caption images and to translate into the same language.

The joint model (:class:`~attnkit.model.EncoderDecoder`) has an image encoder and a text encoder
that both hand the decoder a memory of the same size; the decoder, its target
embeddings, attention and output layer are shared. Training mixes batches of the
two tasks (``train.caption_share`` of them caption), each batch from one task, and
validates both (the score is the mean of caption BLEU-4 and translation BLEU). With
``train.objective: scst`` (after a cross-entropy run, ``train.init_from``) the caption
batches train self-critically, one photo an example, while the translation batches keep
their cross-entropy. The
checkpoint's task is ``multitask``: :class:`~attnkit.captioning.Captioner` and
:class:`~attnkit.translation.Translator` both load it, so ``attnkit caption``
and ``attnkit translate`` work on it, the input choosing the encoder.

Data: ``data.path`` is a captioning dataset, ``data.text_path`` a parallel-text
dataset whose target language is the captions' language (the synthetic scenes of
:mod:`attnkit.data.scenes` come with both).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import torch
from torch import nn

from attnkit.captioning import (
    CaptionPipeline, caption_attention_drawer, caption_training_set, caption_validation, describe_images, describe_start, parameter_groups,
    record_weights, self_critical_training, starting_checkpoint,
)  # fmt: skip
from attnkit.checkpoint import Checkpoint, load_weights
from attnkit.config import ExperimentConfig
from attnkit.data.batching import Batch, BatchLimit, TaskMixSampler
from attnkit.data.captions import image_root, read_caption_split, require_split_photos
from attnkit.data.text import collate_pairs, read_parallel, resolve_languages
from attnkit.errors import UserError
from attnkit.losses import LossOutput, Seq2SeqObjective
from attnkit.model import MULTITASK, build_multitask_model, describe_parameters
from attnkit.train import RunContext, TaskSetup, TrainingProgress, too_few_examples, train_recipe, validation_subset
from attnkit.supervision import describe_gold
from attnkit.text_pipeline import TextPipeline
from attnkit.translation import translation_attention_drawer, translation_training_set, translation_validation

TASK = MULTITASK


class TaskMixDataset(torch.utils.data.Dataset):
    """Several tasks' datasets end to end; item ``i`` is ``(task, example)`` from the dataset it falls in."""

    def __init__(self, datasets: Mapping[str, torch.utils.data.Dataset]):
        self.tasks = list(datasets)
        self.datasets = list(datasets.values())
        self.offsets = [0]
        for dataset in self.datasets[:-1]:
            self.offsets.append(self.offsets[-1] + len(dataset))

    def __len__(self) -> int:
        return self.offsets[-1] + len(self.datasets[-1])

    def __getitem__(self, index: int):
        task = bisect.bisect_right(self.offsets, index) - 1
        return self.tasks[task], self.datasets[task][index - self.offsets[task]]


@dataclass(frozen=True)
class TaskMixCollate:
    """The collate function for batches of one task each (as :class:`TaskMixSampler` makes them): each task's own
    ``collates[task]``. A class at module level, not a closure, so that loader workers started by pickling (Python
    3.14's default on Linux, macOS, Windows) can take it."""

    collates: Mapping[str, Callable]

    def __call__(self, examples):
        task = examples[0][0]
        if any(t != task for t, _ in examples):
            raise ValueError("a batch mixes tasks; use TaskMixSampler")
        return self.collates[task]([example for _, example in examples])


@dataclass(frozen=True)
class ObjectivePerInput:
    """The objective of each batch chosen by what its encoder reads (``Source.kind``): a joint model's caption
    batches may train self-critically while its translation batches keep their cross-entropy."""

    by_kind: Mapping[str, Callable[[nn.Module, Batch], LossOutput]]

    def __call__(self, model: nn.Module, batch: Batch) -> LossOutput:
        return self.by_kind[batch.source.kind](model, batch)


def joint_pipelines(checkpoint: Checkpoint) -> tuple[TextPipeline, CaptionPipeline]:
    text = TextPipeline.from_checkpoint(checkpoint)
    return text, CaptionPipeline(text.target_tokenizer, text.target_vocab, text.target_lang)


def prepare_multitask(config: ExperimentConfig, resume: Checkpoint | None, context: RunContext) -> TaskSetup:
    """The joint task's two datasets, mixed batch by batch, its model and the validation of both tasks."""
    if not config.data.text_path:
        raise UserError("task multitask needs data.text_path (a parallel-text dataset) besides data.path (a captioning dataset)")
    source_lang, target_lang = resolve_languages(config.data.text_path, config.data.source_lang, config.data.target_lang)
    config = replace(config, data=replace(config.data, source_lang=source_lang, target_lang=target_lang))
    captions_folder = Path(config.data.path)
    root = image_root(captions_folder)
    train_items = read_caption_split(captions_folder, "train")
    valid_items = validation_subset(read_caption_split(captions_folder, "valid"), config.train)
    require_split_photos(root, {"train": train_items, "valid": valid_items})
    train_pairs = read_parallel(config.data.text_path, "train", source_lang, target_lang)
    valid_pairs = validation_subset(read_parallel(config.data.text_path, "valid", source_lang, target_lang), config.train)

    start, config = starting_checkpoint(config, resume, TASK)
    if resume is not None or start is not None:
        text, captions = joint_pipelines(resume or start)
    else:
        all_captions = [caption for item in train_items for caption in item.captions]
        text = TextPipeline.build(config, train_pairs, source_lang, target_lang, more_targets=all_captions)
        captions = CaptionPipeline(text.target_tokenizer, text.target_vocab, target_lang)
    model = build_multitask_model(config, text.source_vocab, text.target_vocab, load_weights=resume is None and start is None)
    if start is not None:
        load_weights(model, start)
    image_encoder = model.encoder_for("image")
    config = record_weights(config, image_encoder)
    caption_set, collate_captions, cache = caption_training_set(config, image_encoder, captions, train_items, root, context)
    valid_cache = cache.kept_in_memory() if cache is not None else None  # the validation photos read from disk once
    text_set = translation_training_set(config, text, train_pairs, config.data.text_path)
    translation_objective = Seq2SeqObjective.from_config(config.train, text.target_vocab.pad_index)
    objective, caption_keys = translation_objective, caption_set.lengths
    self_critical = config.train.objective == "scst"
    if self_critical:
        caption_set, caption_objective, caption_keys = self_critical_training(config, captions, train_items, caption_set)
        objective = ObjectivePerInput({"image": caption_objective, "text": translation_objective})
    mix = TaskMixDataset({"image": caption_set, "text": text_set})
    share = config.train.caption_share
    for what, folder, examples, task_share in (("caption", config.data.path, caption_set, share), ("translation", config.data.text_path, text_set, 1.0 - share)):
        if task_share > 0 and len(examples) < context.distributed.world_size:  # a task given batches must have some
            problem = too_few_examples(len(examples), context.distributed.world_size, f"{what} training examples")
            raise UserError(f"{folder}: {problem}; train.caption_share={share} gives the {what}s {task_share:.0%} of the batches")
    seed = config.train.seed

    def batches(limit: BatchLimit) -> TaskMixSampler:
        return TaskMixSampler.bucketed([caption_keys, text_set.lengths], mix.offsets, [share, 1.0 - share], limit, seed=seed)

    def validate(trained: nn.Module) -> dict:
        caption = caption_validation(trained, captions, config, valid_items, root, valid_cache) if share > 0 else {}
        translation = translation_validation(trained, text, config, valid_pairs) if share < 1 else {}
        scores = [s for s in (caption.get("bleu4"), translation.get("bleu")) if s is not None]
        return {**{f"caption_{k}": v for k, v in caption.items()}, **translation, "score": round(sum(scores) / len(scores), 2)}

    drawers = [
        *([caption_attention_drawer(captions, config, root / valid_items[0].image, valid_cache)] if share > 0 and valid_items else []),
        *([translation_attention_drawer(text, config, valid_pairs[0][0])] if share < 1 and valid_pairs else []),
    ]

    def draw_attention(trained: nn.Module, folder: Path) -> dict[str, Path]:
        return {tag: png for draw in drawers for tag, png in draw(trained, folder).items()}  # the photo's and the sentence's

    notes = [
        f"multitask: {len(caption_set)} {'photos' if self_critical else 'captions'} of {describe_images(caption_set.paths)} and {len(text_set)} "
        f"{source_lang}->{target_lang} pairs; {share:.0%} of the batches caption; vocabulary {len(text.source_vocab)} / {len(text.target_vocab)} (shared by both tasks)",
        *describe_gold(caption_set.gold, "training captions"),
        *describe_gold(text_set.gold, "training pairs"),
        describe_parameters(model),
        *describe_start(config, start, " of the caption batches"),
    ]
    return TaskSetup(
        config,
        model,
        objective,
        mix,
        TaskMixCollate({"image": collate_captions, "text": partial(collate_pairs, gold=text_set.gold)}),
        validate,
        text.vocabularies,
        parameter_groups(model, image_encoder, config),
        batches,
        subword_models=text.subword_models,
        idle_parameters=True,  # a captioning batch leaves the text encoder without gradients, and the other way round
        validation_examples=min(len(valid_items) if share > 0 else 1, len(valid_pairs) if share < 1 else 1),
        notes=notes,
        draw_attention=draw_attention,
    )


def train_multitask(
    config: ExperimentConfig, resume: Checkpoint | None = None, overwrite: bool = False, progress_bar: bool = True, log=print
) -> TrainingProgress:
    """Train (or continue) a joint captioning + translation model; checkpoints go to ``config.run_dir``."""
    return train_recipe(config, TASK, prepare_multitask, resume, overwrite, progress_bar, log)
