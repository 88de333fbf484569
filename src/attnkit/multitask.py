"""The joint task: one decoder learns to caption images and to translate into the same language.

A :class:`~attnkit.model.MultiTaskModel` has an image encoder and a text encoder
that both hand the decoder a memory of the same size; the decoder, its target
embeddings, attention and output layer are shared. Training mixes batches of the
two tasks (``train.caption_share`` of them caption), each batch from one task, and
validates both (the score is the mean of caption BLEU-4 and translation BLEU). The
checkpoint's task is ``multitask``: :class:`~attnkit.captioning.Captioner` and
:class:`~attnkit.translation.Translator` both load it, so ``tasks/caption.py``
and ``tasks/translate.py`` work on it, the input choosing the encoder.

Data: ``data.path`` is a captioning dataset, ``data.text_path`` a parallel-text
dataset whose target language is the captions' language (the synthetic scenes of
:mod:`attnkit.data.scenes` come with both).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from attnkit.captioning import CaptionPipeline, caption_training_set, caption_validation, parameter_groups, record_weights
from attnkit.checkpoint import Checkpoint
from attnkit.config import ExperimentConfig, to_dict
from attnkit.data.batching import BucketBatchSampler, TaskMixSampler
from attnkit.data.captions import image_root, read_caption_split
from attnkit.data.text import collate_pairs, read_parallel, resolve_languages
from attnkit.errors import UserError
from attnkit.model import MULTITASK, Seq2SeqObjective, build_multitask_model
from attnkit.train import CheckpointContents, Trainer, TrainingProgress, claim_run_dir, run_training
from attnkit.translation import TextPipeline, count_parameters, translation_validation

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


def collate_task_mix(collates: Mapping[str, Callable]) -> Callable:
    """A collate function for batches of one task each (as :class:`TaskMixSampler` makes them)."""

    def collate(examples):
        task = examples[0][0]
        if any(t != task for t, _ in examples):
            raise ValueError("a batch mixes tasks; use TaskMixSampler")
        return collates[task]([example for _, example in examples])

    return collate


def joint_pipelines(checkpoint: Checkpoint) -> tuple[TextPipeline, CaptionPipeline]:
    text = TextPipeline.from_checkpoint(checkpoint)
    return text, CaptionPipeline(text.target_tokenizer, text.target_vocab, text.target_lang)


def train_multitask(
    config: ExperimentConfig, resume: Checkpoint | None = None, overwrite: bool = False, progress_bar: bool = True, log=print
) -> TrainingProgress:
    """Train (or continue) a joint captioning + translation model; checkpoints go to ``config.run_dir``."""
    if not config.data.text_path:
        raise UserError("task multitask needs data.text_path (a parallel-text dataset) besides data.path (a captioning dataset)")
    if not 0.0 <= config.train.caption_share <= 1.0:
        raise UserError(f"train.caption_share must be between 0 and 1, got {config.train.caption_share}")
    run_dir = claim_run_dir(config, resume is not None, overwrite)
    source_lang, target_lang = resolve_languages(config.data.text_path, config.data.source_lang, config.data.target_lang)
    config = replace(config, data=replace(config.data, source_lang=source_lang, target_lang=target_lang))
    captions_folder = Path(config.data.path)
    root = image_root(captions_folder)
    train_items, valid_items = read_caption_split(captions_folder, "train"), read_caption_split(captions_folder, "valid")
    train_pairs = read_parallel(config.data.text_path, "train", source_lang, target_lang)
    valid_pairs = read_parallel(config.data.text_path, "valid", source_lang, target_lang)
    if config.train.valid_max_examples > 0:
        valid_items, valid_pairs = valid_items[: config.train.valid_max_examples], valid_pairs[: config.train.valid_max_examples]
    torch.manual_seed(config.train.seed)

    if resume is not None:
        text, captions = joint_pipelines(resume)
    else:
        all_captions = [caption for item in train_items for caption in item.captions]
        text = TextPipeline.build(config, train_pairs, source_lang, target_lang, more_targets=all_captions)
        captions = CaptionPipeline(text.target_tokenizer, text.target_vocab, target_lang)
    model = build_multitask_model(config, text.source_vocab, text.target_vocab, load_weights=resume is None)
    image_encoder = model.encoder_for("image")
    config = record_weights(config, image_encoder)
    caption_set, collate_captions, cache = caption_training_set(config, image_encoder, captions, train_items, root, log)
    text_set = text.encode_pairs(train_pairs, config.data.max_source_length, config.data.max_target_length)
    mix = TaskMixDataset({"image": caption_set, "text": text_set})
    share = config.train.caption_share
    batches = TaskMixSampler(
        [BucketBatchSampler(caption_set.lengths, config.train.batch_size, seed=config.train.seed), BucketBatchSampler(text_set.lengths, config.train.batch_size, seed=config.train.seed)],
        mix.offsets,
        [share, 1.0 - share],
        seed=config.train.seed,
    )
    log(
        f"multitask: {len(caption_set)} captions of {len(caption_set.paths)} images and {len(text_set)} {source_lang}->{target_lang} pairs; "
        f"{share:.0%} of the batches caption; vocabulary {len(text.source_vocab)} / {len(text.target_vocab)} (shared by both tasks)"
    )
    log(f"model: {count_parameters(model):,} parameters ({sum(p.numel() for p in model.parameters() if p.requires_grad):,} trainable)")

    def validate(trained: nn.Module) -> dict:
        caption = caption_validation(trained, captions, config, valid_items, root, cache) if share > 0 else {}
        translation = translation_validation(trained, text, config, valid_pairs) if share < 1 else {}
        scores = [s for s in (caption.get("bleu4"), translation.get("bleu")) if s is not None]
        return {**{f"caption_{k}": v for k, v in caption.items()}, **translation, "score": round(sum(scores) / len(scores), 2)}

    trainer = Trainer(
        model,
        Seq2SeqObjective.from_config(config.train, text.target_vocab.pad_index),
        mix,
        collate_task_mix({"image": collate_captions, "text": collate_pairs}),
        validate,
        config.train,
        run_dir,
        CheckpointContents(TASK, to_dict(config), text.vocabularies),
        progress_bar=progress_bar,
        log=log,
        parameter_groups=parameter_groups(model, image_encoder, config),
        batch_sampler=batches,
    )
    return run_training(trainer, config, resume, log)
