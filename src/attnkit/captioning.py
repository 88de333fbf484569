"""Captioning: images in, text out, through the same encoder-decoder as translation.

:class:`CaptionPipeline` turns captions into ids and back (tokeniser,
vocabulary) and knows the image preprocessing; it is rebuilt from a checkpoint
alone. :class:`Captioner` captions image files in batches (one batched beam
search for many images) and scores them against references.
:func:`prepare_captioning` is what the task adds to the shared recipe
(:func:`~attnkit.train.train_recipe`): its data, feature cache, model and validation. After the image encoder nothing
here differs from translation: the decoder, search, objective and trainer are
the shared ones.

Legend: N images, C backbone channels, g grid side, L = g*g cells.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import torch
from PIL import Image
from torch import Tensor, nn

from attnkit.checkpoint import Checkpoint, load_checkpoint, load_weights
from attnkit.config import ExperimentConfig, SearchConfig, from_dict, model_differences, to_dict, widened_beam
from attnkit.data.batching import Batch, BucketBatchSampler, batch_gold, pad_sequences
from attnkit.data.captions import CaptionedImage, image_root, read_caption_split, require_split_photos
from attnkit.data.features import FeatureCache, encoder_identity
from attnkit.data.images import ImageError, ImageSource, MosaicFile, image_tensor, load_image, load_image_source, mosaic_arrangements, grey_cells, open_rgb
from attnkit.encoders.image import ImageEncoder
from attnkit.ensemble import EnsembleDecoder
from attnkit.errors import UserError
from attnkit.importance import HideableSource
from attnkit.interfaces import EncoderOutput, GridFeatures, Pixels
from attnkit.metrics import caption_scores
from attnkit.losses import Seq2SeqObjective
from attnkit.model import MULTITASK, EncoderDecoder, build_captioning_model, describe_parameters, model_from_checkpoint
from attnkit.search import search
from attnkit.self_critical import SelfCriticalObjective, cider_d_reward
from attnkit.supervision import CaptionGold, caption_gold, describe_gold, require_gold, scene_ground_truth
from attnkit.distributed import autocast, decoding_precision, resolve_device
from attnkit.train import RunContext, TaskSetup, TrainingProgress, train_recipe, validation_subset
from attnkit.vocab import EOS, SubwordModel, Tokenizer, Vocabulary
from attnkit.watch import DrawAttention

TASK = "captioning"
ImageInput = str | Path | Image.Image  # an image file, or an image already in memory (e.g. a generated scene)


@dataclass(frozen=True)
class CaptionPipeline:
    tokenizer: Tokenizer
    vocab: Vocabulary
    language: str

    @classmethod
    def build(cls, config: ExperimentConfig, captions: Sequence[str], language: str) -> "CaptionPipeline":
        tokenizer = Tokenizer(config.data.tokenizer, language)
        vocab = Vocabulary.build([tokenizer.tokenize(c) for c in captions], config.data.min_freq, config.data.max_vocab)
        return cls(tokenizer, vocab, language)

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint) -> "CaptionPipeline":
        config = from_dict(ExperimentConfig, checkpoint.config)
        language = config.data.target_lang or "en"
        subwords = checkpoint.subword_models.get("target")  # a joint model's with subword vocabularies
        tokenizer = Tokenizer(config.data.tokenizer, language, SubwordModel(subwords) if subwords is not None else None)
        return cls(tokenizer, Vocabulary(checkpoint.vocabularies["target"]), language)

    @property
    def vocabularies(self) -> dict[str, list[str]]:
        return {"target": self.vocab.to_list()}

    def scored_words(self, tokens: Sequence[str]) -> list[str]:
        """A caption's tokens as caption metrics score them (BLEU, CIDEr-D, METEOR, SCST's reward): its words, or, for
        a joint model's subword pieces, the words of their text (:meth:`Tokenizer.words`, as its references are read)."""
        if self.tokenizer.subwords is None:
            return list(tokens)
        return self.tokenizer.words(self.tokenizer.detokenize(tokens))


class CaptionDataset(torch.utils.data.Dataset):
    """One example per (image, caption); the image is a row of ``sources`` (cached features) or a file (or a mosaic of
    four, :func:`with_training_mosaics`) loaded on demand."""

    def __init__(
        self, image_ids: list[int], caption_ids: list[list[int]], sources: Tensor | None, paths: list[ImageSource], size: int, normalization, gold: list | None = None
    ):
        self.image_ids, self.caption_ids = image_ids, caption_ids
        self.gold = gold  # per caption, its gold attention (attention supervision), else None
        self.sources, self.paths, self.size, self.normalization = sources, paths, size, normalization

    def __len__(self) -> int:
        return len(self.image_ids)

    def __getitem__(self, index: int) -> tuple[int, Tensor, list[int]]:
        image = self.image_ids[index]
        source = self.sources[image] if self.sources is not None else load_image_source(self.paths[image], self.size, self.normalization)
        return index, source, self.caption_ids[index]

    @property
    def lengths(self) -> list[tuple[int, int]]:
        return [(len(ids), 0) for ids in self.caption_ids]

    def one_per_photo(self) -> "CaptionDataset":
        """One example per photo, its first caption as the target (which self-critical training does not read: it
        samples its own captions and scores them against all of the photo's references)."""
        first: dict[int, int] = {}
        for example, image in enumerate(self.image_ids):
            first.setdefault(image, example)
        kept = list(first.values())
        return CaptionDataset([self.image_ids[e] for e in kept], [self.caption_ids[e] for e in kept], self.sources, self.paths, self.size, self.normalization)


def describe_images(images: Sequence[ImageSource]) -> str:
    """"2819 images", or "2819 images (and 705 mosaics of them)"."""
    mosaics = sum(isinstance(image, MosaicFile) for image in images)
    return f"{len(images) - mosaics} images" + (f" (and {mosaics} mosaics of them)" if mosaics else "")


def collate_captions(examples, cached: bool, gold: Sequence | None = None) -> Batch:
    """``gold``: the dataset's gold attention per caption (attention supervision), else None."""
    index, sources, captions = zip(*examples)
    stacked = torch.stack(sources)
    source = GridFeatures(stacked) if cached else Pixels(stacked)  # (B, C, g, g) fp16, upcast on the device | (B, 3, H, W)
    attention_gold = None if gold is None else batch_gold([gold[i] for i in index])
    return Batch(source, pad_sequences(captions).ids, torch.tensor(index), attention_gold)


@dataclass(frozen=True)
class Caption:
    image: str  # the path as given
    words: list[str]
    text: str
    score: float
    attention: Tensor  # (T, L): one row per output step (incl. <eos> when finished) over the grid cells
    grid: tuple[int, int]  # (height, width) of the attention grid, from the encoder's layout
    finished: bool
    error: str | None = None  # why this image was not captioned


class Captioner:
    def __init__(
        self, model: EncoderDecoder, pipeline: CaptionPipeline, search_config: SearchConfig, device: torch.device, cache: FeatureCache | None = None,
        precision: torch.dtype = torch.float32,
    ):  # fmt: skip
        """``precision``: the autocast dtype decoding runs under (from a checkpoint: its training's, as validation ran)."""
        self.model = model.to(device).eval()
        self.pipeline = pipeline
        self.search = search_config
        self.device = device
        self.precision = precision
        self.cache = cache if cache is not None and model.encoder_for("image").caches else None
        self.ensemble: list[Captioner] = []  # other members that decode with this one (from_checkpoints)

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint: str | Path | Checkpoint,
        device: str = "auto",
        cache_dir: str | Path | None = None,
        model: EncoderDecoder | None = None,
        precision: str = "checkpoint",
    ) -> "Captioner":
        """A captioner from a checkpoint file (or one already loaded); ``model``: its model when already built;
        ``precision``: what it decodes in (:func:`attnkit.distributed.decoding_precision`)."""
        if not isinstance(checkpoint, Checkpoint):
            checkpoint = load_checkpoint(checkpoint, task=(TASK, MULTITASK))
        config = from_dict(ExperimentConfig, checkpoint.config)
        pipeline = CaptionPipeline.from_checkpoint(checkpoint)
        if model is None:
            model = model_from_checkpoint(checkpoint)
        cache = _feature_cache(model.encoder_for("image"), cache_dir) if cache_dir else None
        device = resolve_device(device)
        return cls(model, pipeline, config.search, device, cache, decoding_precision(precision, config.train.precision))

    @classmethod
    def from_checkpoints(
        cls, checkpoints: Sequence[str | Path | Checkpoint], device: str = "auto", cache_dir: str | Path | None = None, precision: str = "checkpoint"
    ) -> "Captioner":
        """The captioner of one checkpoint, or of several an ensemble (:mod:`attnkit.ensemble`): every caption is searched
        over the mean of their next-word log-probabilities; each member reads the image its own way (size, backbone,
        feature cache). The members must share one vocabulary: checkpoints of one recipe (its seeds, its epochs)."""
        if not checkpoints:
            raise UserError("no checkpoint given")
        first = cls.from_checkpoint(checkpoints[0], device, cache_dir, precision=precision)  # the ensemble decodes in the first's precision
        for number, path in enumerate(checkpoints[1:], 2):
            member = cls.from_checkpoint(path, device, cache_dir, precision=precision)
            if member.pipeline.vocabularies != first.pipeline.vocabularies:
                named = path if not isinstance(path, Checkpoint) else f"checkpoint {number}"
                raise UserError(f"{named} has another vocabulary than the first checkpoint: an ensemble's checkpoints must share one (checkpoints of one recipe: its seeds, its epochs)")
            first.ensemble.append(member)
        return first

    def _sources(self, images: Sequence[ImageInput]) -> Pixels | GridFeatures:
        encoder: ImageEncoder = self.model.encoder_for("image")
        if self.cache is not None and not any(isinstance(image, Image.Image) for image in images):
            return GridFeatures(self.cache.get([Path(p) for p in images], partial(_grid_on, encoder, self.device)))  # fp16 until .to()
        return Pixels(torch.stack([self._pixels(image) for image in images]))

    def _pixels(self, image: ImageInput) -> Tensor:
        """(3, size, size) normalised pixels of an image file or a PIL image (ImageError for a bad file)."""
        encoder: ImageEncoder = self.model.encoder_for("image")
        size, normalization = encoder.config.image_size, encoder.normalization
        if isinstance(image, Image.Image):
            return image_tensor(image.convert("RGB"), size, normalization)
        return load_image(image, size, normalization)

    @torch.no_grad()
    def encode(self, images: Sequence[ImageInput]) -> EncoderOutput:
        """The image encoder's output for image files or PIL images (raises ImageError for a bad file)."""
        return self.model.encode(self._sources(images).to(self.device))

    def hideable(self, image: ImageInput, grid: tuple[int, int]) -> HideableSource:
        """``image`` as a source whose grid cells can be hidden: each keep mask (B, rows, columns) greys the pixels of
        the cells it drops (:func:`attnkit.data.images.grey_cells`) and encodes the copies through the whole backbone,
        so they differ by the greyed cells only (a feature cache holds no greyed photos, and its fp16 features would
        differ a little everywhere). The input of every estimator in :mod:`attnkit.importance`."""
        pixels = self._pixels(image).to(self.device)  # (3, H, W)

        @torch.no_grad()
        def encode_keeping(keep: Tensor) -> EncoderOutput:
            return self.model.encode(Pixels(grey_cells(pixels, keep)))

        return HideableSource(tuple(grid), encode_keeping, "image")

    @torch.no_grad()
    def caption(self, images: Sequence[ImageInput], beam_size: int | None = None, batch_size: int = 32, n_best: int = 1) -> list[list[Caption]]:
        """The ``n_best`` captions of each image (a file path or a PIL image), in input order; an unreadable
        image gets one Caption with ``error``. With no ``beam_size``, the checkpoint's beam is widened to ``n_best``."""
        results: list[list[Caption] | None] = [None] * len(images)
        vocab = self.pipeline.vocab
        beam_size = widened_beam(beam_size, self.search.beam_size, n_best)
        vocab.check_beam(beam_size)
        for start in range(0, len(images), batch_size):
            chunk = list(range(start, min(start + batch_size, len(images))))
            try:
                with autocast(self.device, self.precision):  # as validation decodes, so test and validation scores compare
                    encoded = self.encode([images[i] for i in chunk])
            except ImageError as error:  # isolate the bad image: the others are still captioned
                if len(chunk) == 1:
                    results[chunk[0]] = [Caption(_name(images[chunk[0]], chunk[0]), [], "", float("-inf"), torch.zeros(0, 0), (0, 0), False, error=str(error))]
                else:
                    for i in chunk:
                        results[i] = self.caption([images[i]], beam_size, 1, n_best)[0]
                continue
            with autocast(self.device, self.precision):
                decoder = self.model.decoder
                if self.ensemble:  # every member encodes the chunk its own way; an unreadable image failed above already
                    decoder = EnsembleDecoder([(decoder, encoded), *((m.model.decoder, m.encode([images[i] for i in chunk])) for m in self.ensemble)])
                found = search(decoder, encoded, vocab.bos_index, vocab.eos_index, self.search, beam_size, n_best, never=vocab.never_output)
            grid = (encoded.layout.height, encoded.layout.width)
            for i, hypotheses in zip(chunk, found):
                results[i] = [self._caption(_name(images[i], i), h, grid) for h in hypotheses]
        return results  # type: ignore[return-value]

    def _caption(self, image: str, hypothesis, grid: tuple[int, int]) -> Caption:
        words = self.pipeline.vocab.decode(hypothesis.tokens)
        text = self.pipeline.tokenizer.detokenize(words)
        return Caption(image, words, text, hypothesis.score, hypothesis.attention, grid, hypothesis.finished)

    def evaluate(
        self, items: Sequence[CaptionedImage], root: Path, beam_size: int | None = None, batch_size: int = 32, meteor: bool = True, log=print
    ) -> dict:
        """Caption metrics of ``items`` (image paths relative to ``root``) against all their references (METEOR optional: it starts Java)."""
        hypotheses, references, unreadable = self.caption_with_references(items, root, beam_size, batch_size, log)
        if unreadable == len(items):  # scores of nothing but empty captions would read as a model's
            raise UserError(f"none of the {len(items)} images could be read (the warnings above say why): nothing to score")
        scores = caption_scores(hypotheses, references, meteor=meteor, log=log)
        return {**scores, "images": len(items), "unreadable": unreadable, "beam_size": beam_size or self.search.beam_size}

    def caption_with_references(
        self, items: Sequence[CaptionedImage], root: Path, beam_size: int | None = None, batch_size: int = 32, log=print
    ) -> tuple[list[list[str]], list[list[list[str]]], int]:
        """What :meth:`evaluate` scores: each image's best caption (its words; none for an image that cannot be read,
        which ``log`` warns of), its references as words (:meth:`CaptionPipeline.scored_words`), and how many
        images could not be read."""
        if not items:
            raise UserError("nothing to evaluate: no images")
        captions = self.caption([root / item.image for item in items], beam_size, batch_size)
        failed = [c[0] for c in captions if c[0].error]
        for caption in failed:
            log(f"warning: {caption.error}")
        words = self.pipeline.tokenizer.words
        references = [[words(r) for r in item.captions] for item in items]
        return [self.pipeline.scored_words(c[0].words) for c in captions], references, len(failed)


def _name(image: ImageInput, number: int) -> str:
    return f"<image {number}>" if isinstance(image, Image.Image) else str(image)


def _grid_on(encoder: ImageEncoder, device: torch.device, pixels: Tensor) -> Tensor:
    """Features for the cache: always in eval mode (no dropout, pretrained BatchNorm statistics)."""
    was_training = encoder.training
    encoder.eval()
    try:
        return encoder.cacheable_features(pixels.to(device))
    finally:
        encoder.train(was_training)


def _feature_cache(encoder: ImageEncoder, root: str | Path) -> FeatureCache | None:
    """A cache for this encoder, or None when caching does not apply (a wholly fine-tuned or random backbone)."""
    identity = encoder_identity(encoder)
    if not encoder.caches or identity["weights_sha256"] == "none":
        return None
    return FeatureCache(root, identity)


def _examples(
    items: Sequence[CaptionedImage], root: Path, pipeline: CaptionPipeline, max_length: int, gold_of: CaptionGold | None = None
) -> tuple[list[Path], list[int], list[list[int]], list | None]:
    """Image paths, and per usable caption its image's number, its ids and (with ``gold_of``) its gold attention."""
    paths = [root / item.image for item in items]
    image_ids, caption_ids, gold = [], [], []
    for image, item in enumerate(items):
        for caption in item.captions:
            words = pipeline.tokenizer.tokenize(caption)
            if 0 < len(words) <= max_length:
                image_ids.append(image)
                caption_ids.append(pipeline.vocab.encode(words, add_bos=True, add_eos=True))
                gold.append(gold_of(item.image, words) if gold_of is not None else None)
    return paths, image_ids, caption_ids, gold if gold_of is not None else None


def record_weights(config: ExperimentConfig, encoder: ImageEncoder) -> ExperimentConfig:
    """The config with the digest of the encoder's pretrained weights: the checkpoint then keys the feature cache without the file."""
    config = replace(config, image_encoder=replace(config.image_encoder, weights_sha256=encoder.weights_digest))
    encoder.config = config.image_encoder
    return config


def caption_training_set(
    config: ExperimentConfig, encoder: ImageEncoder, pipeline: CaptionPipeline, items: Sequence[CaptionedImage], root: Path, context: RunContext
) -> tuple[CaptionDataset, Callable, FeatureCache | None]:
    """The training captions as a dataset (with the frozen encoder's features cached when the config says so),
    its collate function and the cache (None without one). Under ``torchrun`` rank 0 computes the missing
    features; the other ranks wait and read them."""
    paths, image_ids, caption_ids, gold = _examples(items, root, pipeline, config.data.max_target_length, _caption_gold_of(config))
    if not caption_ids:
        raise UserError(f"{config.data.path}: no usable training captions")
    if gold is not None:
        require_gold(gold, f"training captions of {config.data.path}", "they must be the scene folder's own captions, tokenised into its words, e.g. data.tokenizer.kind=space")
    if config.data.mosaic_share > 0:  # never with gold attention (the config refuses the pair)
        paths, image_ids, caption_ids = with_training_mosaics(paths, image_ids, caption_ids, config.data.mosaic_share, config.train.seed)
    cache = _feature_cache(encoder, config.data.feature_cache) if config.data.feature_cache else None
    sources = None
    if cache is not None:
        device, log = context.device, context.log
        log(f"feature cache {cache.folder}: computing or reading the grid features of {describe_images(paths)} for training")
        with context.distributed.main_first():
            sources = cache.get(paths, partial(_grid_on, encoder.to(device), device))
        log(f"feature cache: {cache.stats.hits} hits, {cache.stats.misses} computed")
    dataset = CaptionDataset(image_ids, caption_ids, sources, paths, config.image_encoder.image_size, encoder.normalization, gold)
    return dataset, partial(collate_captions, cached=sources is not None, gold=gold), cache


def with_training_mosaics(
    paths: list[Path], image_ids: list[int], caption_ids: list[list[int]], share: float, seed: int
) -> tuple[list[ImageSource], list[int], list[list[int]]]:
    """The training examples and, for a seeded ``share`` of the photos, the photo once more in a 2 x 2 mosaic with three
    other training photos (its quadrant drawn too) carrying the photo's own captions.

    Only the caption says which quadrant it is about, so the decoder must read the caption so far to know where to
    look: the lesson the mosaic localisation test (:func:`attnkit.comparison.mosaic_study`) asks about. The mosaics
    are drawn once per run (not per epoch), so a frozen encoder's features of them are cached like a photo's."""
    described = sorted(random.Random(seed).sample(range(len(paths)), round(share * len(paths))))
    if not described:
        return paths, image_ids, caption_ids
    captions_of: dict[int, list[list[int]]] = {}
    for image, ids in zip(image_ids, caption_ids):
        captions_of.setdefault(image, []).append(ids)
    mosaics, mosaic_image_ids, mosaic_caption_ids = [], [], []
    for photo, order in zip(described, mosaic_arrangements(len(paths), seed, described)):
        mosaics.append(MosaicFile(tuple(paths[i] for i in order)))
        for ids in captions_of.get(photo, []):
            mosaic_image_ids.append(len(paths) + len(mosaics) - 1)
            mosaic_caption_ids.append(ids)
    return [*paths, *mosaics], image_ids + mosaic_image_ids, caption_ids + mosaic_caption_ids


def _caption_gold_of(config: ExperimentConfig) -> CaptionGold | None:
    """With ``train.attention_supervision``, each scene caption's gold attention over the encoder's fixed grid."""
    if config.train.attention_supervision <= 0:
        return None
    grid = config.image_encoder.grid_size
    if not grid:
        raise UserError("train.attention_supervision on images needs a fixed image_encoder.grid_size (the gold cells are cells of that grid)")
    return caption_gold(scene_ground_truth(config.data.path), (grid, grid))


def caption_validation(
    model: nn.Module, pipeline: CaptionPipeline, config: ExperimentConfig, items: Sequence[CaptionedImage], root: Path, cache: FeatureCache | None
) -> dict:
    """BLEU-4 and CIDEr-D of free-running decoding (``train.valid_beam_size``) on validation images."""
    captioner = Captioner(model, pipeline, config.search, next(model.parameters()).device, cache)
    metrics = captioner.evaluate(items, root, beam_size=config.train.valid_beam_size, batch_size=64, meteor=False)
    return {"bleu4": metrics["bleu4"], "cider_d": metrics["cider_d"]}


def draw_caption_attention(caption: Caption, image, path: str | Path) -> Path:
    """The photo and one panel per generated word (and <eos> when it finished) with its attention overlaid."""
    from attnkit.viz import plot_image_attention  # matplotlib: only when drawing

    words = caption.words + ([EOS] if caption.finished else [])
    return plot_image_attention(image, words, caption.attention, caption.grid, path, title=caption.text)


def caption_attention_drawer(pipeline: CaptionPipeline, config: ExperimentConfig, image: Path, cache: FeatureCache | None) -> DrawAttention:
    """Draws the attention over ``image`` (one fixed validation photo) captioned greedily by the model in training."""

    def draw(model: nn.Module, folder: Path) -> dict[str, Path]:
        captioner = Captioner(model, pipeline, config.search, next(model.parameters()).device, cache)
        ((best, *_),) = captioner.caption([str(image)], beam_size=1)
        if best.error:
            return {}
        return {"caption": draw_caption_attention(best, open_rgb(image), folder / "caption.png")}

    return draw


def parameter_groups(model: nn.Module, encoder: ImageEncoder, config: ExperimentConfig) -> list[dict]:
    """Adam's groups: the fine-tuned backbone blocks (if any) at ``image_encoder.backbone_lr``, the rest at ``train.lr``."""
    trainable_backbone = [p for p in encoder.backbone.parameters() if p.requires_grad]
    backbone_ids = {id(p) for p in trainable_backbone}
    groups = [{"params": [p for p in model.parameters() if p.requires_grad and id(p) not in backbone_ids]}]
    if trainable_backbone:
        groups.append({"params": trainable_backbone, "lr": config.image_encoder.backbone_lr or config.train.lr})
    return groups


def prepare_captioning(config: ExperimentConfig, resume: Checkpoint | None, context: RunContext) -> TaskSetup:
    """The captioning task's data (features cached when the encoder is frozen), model and validation."""
    folder = Path(config.data.path)
    root = image_root(folder)
    train_items = read_caption_split(folder, "train")
    valid_items = validation_subset(read_caption_split(folder, "valid"), config.train)
    require_split_photos(root, {"train": train_items, "valid": valid_items})
    start, config = starting_checkpoint(config, resume, TASK)
    if resume is not None or start is not None:
        pipeline = CaptionPipeline.from_checkpoint(resume or start)
    else:
        pipeline = CaptionPipeline.build(config, [c for item in train_items for c in item.captions], config.data.target_lang or "en")
    config = replace(config, data=replace(config.data, target_lang=pipeline.language))
    model = build_captioning_model(config, pipeline.vocab, load_weights=resume is None and start is None)
    if start is not None:
        load_weights(model, start)
    encoder = model.encoder_for("image")
    config = record_weights(config, encoder)
    dataset, collate, cache = caption_training_set(config, encoder, pipeline, train_items, root, context)
    valid_cache = cache.kept_in_memory() if cache is not None else None  # the validation photos read from disk once

    def validate(trained: nn.Module) -> dict:
        metrics = caption_validation(trained, pipeline, config, valid_items, root, valid_cache)
        return {**metrics, "score": metrics["cider_d"]}  # CIDEr-D: defined for short captions too

    objective, batches = Seq2SeqObjective.from_config(config.train, pipeline.vocab.pad_index), None
    self_critical = config.train.objective == "scst"
    if self_critical:
        dataset, objective, sort_keys = self_critical_training(config, pipeline, train_items, dataset)
        batches = partial(BucketBatchSampler, sort_keys, shuffle=True, seed=config.train.seed)
    notes = [
        f"captioning: {describe_images(dataset.paths)} for training, {len(dataset)} {'photos' if self_critical else 'captions'}, "
        f"{len(valid_items)} validation images; vocabulary {len(pipeline.vocab)}",
        *describe_gold(dataset.gold, "training captions"),
        describe_parameters(model),
        *describe_start(config, start),
    ]
    return TaskSetup(
        config, model, objective, dataset, collate, validate, pipeline.vocabularies, parameter_groups(model, encoder, config),
        batches=batches, validation_examples=len(valid_items), notes=notes,
        draw_attention=caption_attention_drawer(pipeline, config, root / valid_items[0].image, valid_cache) if valid_items else None,
    )  # fmt: skip


def starting_checkpoint(config: ExperimentConfig, resume: Checkpoint | None, task: str) -> tuple[Checkpoint | None, ExperimentConfig]:
    """``train.init_from`` of a new ``task`` run: the checkpoint of that task and model keys whose weights and
    vocabularies the run starts from (``None`` for a resumed run, which has its weights, or without one), and the
    config keyed to the digest of the backbone weights the checkpoint (``resume`` or the start) was trained from."""
    if resume is not None:
        return None, keyed_to_backbone_of(config, resume)
    if not config.train.init_from:
        return None, config
    start = load_checkpoint(config.train.init_from)
    if start.task != task:
        raise UserError(f"train.init_from: {config.train.init_from} is a {start.task} checkpoint; a {task} run starts from a {task} checkpoint")
    changed = model_differences(start.config, to_dict(config))
    if changed:
        raise UserError(f"train.init_from: the config changes the model of {config.train.init_from} (saved vs asked): {'; '.join(changed)}; keep the saved values")
    return start, keyed_to_backbone_of(config, start)


def keyed_to_backbone_of(config: ExperimentConfig, checkpoint: Checkpoint) -> ExperimentConfig:
    """``config`` with the digest of the backbone weights ``checkpoint`` was trained from. A model built to take a
    checkpoint's weights loads no weights file, so without the saved digest its encoder would call itself random
    ("none") and train without the feature cache, running the frozen blocks at every step."""
    saved = from_dict(ExperimentConfig, checkpoint.config).image_encoder
    return replace(config, image_encoder=replace(config.image_encoder, weights_sha256=saved.weights_sha256))


def describe_start(config: ExperimentConfig, start: Checkpoint | None, trained: str = "") -> list[str]:
    """The notes a run's start prints: its self-critical training (of ``trained``, e.g. a joint model's caption
    batches) and the run whose weights it starts from; none for cross-entropy from scratch."""
    train = config.train
    return [
        *([f"self-critical training{trained}: {train.scst_samples} captions sampled per photo, baseline {train.scst_baseline}"] if train.objective == "scst" else []),
        *([f"starting from the weights of {train.init_from}"] if start is not None else []),
    ]


def self_critical_training(
    config: ExperimentConfig, pipeline: CaptionPipeline, items: Sequence[CaptionedImage], dataset: CaptionDataset
) -> tuple[CaptionDataset, SelfCriticalObjective, list[int]]:
    """SCST's side of a captioning training set: one example per photo, its objective, and the batches' sort keys
    (all alike: batches drawn at random, so every photo weighs the same, not bucketed by one of its captions' length).
    The photos are those cross-entropy trains on: one whose every caption is over ``data.max_target_length`` is not
    sampled (its references still count in CIDEr-D's document frequencies)."""
    photos = dataset.one_per_photo()
    return photos, self_critical_objective(config, pipeline, items, photos), [0] * len(photos)


def self_critical_objective(config: ExperimentConfig, pipeline: CaptionPipeline, items: Sequence[CaptionedImage], dataset: CaptionDataset) -> SelfCriticalObjective:
    """SCST's objective: CIDEr-D against every reference of each training photo (all of them, as the metric reads
    them, also those too long to train on); samples as long as the longest caption training reads, and its <eos>."""
    references = [[pipeline.tokenizer.words(caption) for caption in item.captions] for item in items]
    cider_d = cider_d_reward(references)
    reward = lambda captions, photos: cider_d([pipeline.scored_words(caption) for caption in captions], photos)  # noqa: E731
    train = config.train
    return SelfCriticalObjective(
        reward, pipeline.vocab, dataset.image_ids, train.scst_samples, train.scst_baseline,
        config.data.max_target_length + 1, train.attention_regularization,
    )  # fmt: skip


def train_captioning(
    config: ExperimentConfig, resume: Checkpoint | None = None, overwrite: bool = False, progress_bar: bool = True, log=print
) -> TrainingProgress:
    """Train (or continue) a captioning model as ``config`` says; checkpoints go to ``config.run_dir``."""
    return train_recipe(config, TASK, prepare_captioning, resume, overwrite, progress_bar, log)
