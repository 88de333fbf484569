"""Encoders + the shared decoder, and the model builders of every task (the training objective: :mod:`attnkit.losses`)."""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from attnkit.checkpoint import Checkpoint, load_weights
from attnkit.config import ExperimentConfig, from_dict
from attnkit.data.batching import Batch
from attnkit.decoders import build_decoder
from attnkit.encoders.image import ImageEncoder
from attnkit.encoders.text import build_text_encoder
from attnkit.errors import UserError
from attnkit.interfaces import Decoder, DecoderOutput, Encoder, EncoderOutput, Source
from attnkit.search import Samples, Sampling, sample
from attnkit.vocab import Vocabulary

MULTITASK = "multitask"  # the task name of a joint model; it captions and translates


class EncoderDecoder(nn.Module):
    """Encoders that honour the contract in :mod:`attnkit.interfaces`, by the kind of source each reads
    ("text", "image"), and one decoder of any family (:mod:`attnkit.decoders`).

    A single-task model has one encoder; the joint model has an image and a text encoder whose
    outputs go through the very same decoder (target embeddings, attention and output layer). The
    source's kind picks the encoder; nothing after the encoder knows which one it was.
    """

    def __init__(self, encoders: Mapping[str, Encoder], decoder: Decoder):
        super().__init__()
        self.encoders = nn.ModuleDict(encoders)
        self.decoder = decoder

    def encoder_for(self, kind: str) -> Encoder:
        """The encoder that reads sources of ``kind``; a :class:`UserError` when this model has none."""
        if kind not in self.encoders:
            has = " and ".join(self.encoders)
            raise UserError(f"this model has no {kind} encoder (it has {'an' if has[0] in 'aeiou' else 'a'} {has} encoder{'s' if len(self.encoders) > 1 else ''} only)")
        return self.encoders[kind]

    def encode(self, source: Source) -> EncoderOutput:
        return self.encoder_for(source.kind)(source)

    def forward(self, batch: Batch, teacher_forcing: float = 1.0, need_attention: bool = True, sampling: Sampling | None = None) -> DecoderOutput | Samples:
        """Teacher-forced pass: logits for target[:, 1:] given target[:, :-1] (attention only when ``need_attention``).

        With ``sampling``: outputs drawn from the model's own distribution instead, with gradients (self-critical
        training). It is a mode of ``forward`` because DistributedDataParallel synchronises the gradients of what
        runs through its wrapper's forward only."""
        encoded = self.encode(batch.source)
        if sampling is not None:
            return sample(self.decoder, encoded, sampling.bos, sampling.eos, sampling.pad, sampling.max_length, sampling.per_source, sampling.never)
        return self.decoder(encoded, batch.target[:, :-1], teacher_forcing, need_attention)


def _decoder_for(config: ExperimentConfig, encoder: Encoder, target_vocab: Vocabulary) -> Decoder:
    return build_decoder(config.decoder, len(target_vocab), memory_size=encoder.output_size, init_size=encoder.init_size, pad_index=target_vocab.pad_index)


def build_translation_model(config: ExperimentConfig, source_vocab: Vocabulary, target_vocab: Vocabulary) -> EncoderDecoder:
    encoder = build_text_encoder(config.text_encoder, len(source_vocab), pad_index=source_vocab.pad_index)
    return EncoderDecoder({"text": encoder}, _decoder_for(config, encoder, target_vocab))


def build_captioning_model(config: ExperimentConfig, vocab: Vocabulary, load_weights: bool = True) -> EncoderDecoder:
    """``load_weights=False`` when a checkpoint's state dict follows (it holds the backbone too)."""
    encoder = ImageEncoder(config.image_encoder, load_weights=load_weights)
    return EncoderDecoder({"image": encoder}, _decoder_for(config, encoder, vocab))


def build_multitask_model(config: ExperimentConfig, source_vocab: Vocabulary, target_vocab: Vocabulary, load_weights: bool = True) -> EncoderDecoder:
    """An image encoder and a text encoder over one decoder; both must hand it memories of one size."""
    text = build_text_encoder(config.text_encoder, len(source_vocab), pad_index=source_vocab.pad_index)
    image = ImageEncoder(config.image_encoder, load_weights=load_weights)
    if (image.output_size, image.init_size) != (text.output_size, text.init_size):
        raise UserError(
            f"a shared decoder needs one memory size: image_encoder.memory_size is {image.output_size} but the text "
            f"encoder gives {text.output_size} (text_encoder.hidden_size x 2 when bidirectional); make them equal"
        )
    return EncoderDecoder({"image": image, "text": text}, _decoder_for(config, text, target_vocab))


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def describe_parameters(model: nn.Module) -> str:
    """"model: N parameters (M trainable)", for the training log."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = count_parameters(model)
    return f"model: {total:,} parameters" + (f" ({trainable:,} trainable)" if trainable != total else "")


def model_from_checkpoint(checkpoint: Checkpoint) -> EncoderDecoder:
    """The model a checkpoint holds: built from its task, config and vocabularies, then given its weights
    (a joint checkpoint's one model serves a Captioner and a Translator alike)."""
    if checkpoint.task == "pretrain":
        raise UserError("this is a pre-training checkpoint (task pretrain): a text encoder to start a translator from (text_encoder.init_from), not a model that captions or translates")
    config = from_dict(ExperimentConfig, checkpoint.config)
    target = Vocabulary(checkpoint.vocabularies["target"])
    if checkpoint.task == "captioning":
        model = build_captioning_model(config, target, load_weights=False)  # the backbone's weights are in the checkpoint
    elif checkpoint.task == "translation":
        model = build_translation_model(config, Vocabulary(checkpoint.vocabularies["source"]), target)
    else:  # multitask: load_checkpoint accepts no other task
        model = build_multitask_model(config, Vocabulary(checkpoint.vocabularies["source"]), target, load_weights=False)
    load_weights(model, checkpoint)
    return model
