"""Raw sentences <-> id sequences for one language pair: the tokenisers, vocabularies (and subword models) and
length limit that the text tasks share. Translation, the joint model and pre-training build them alike from the same
``data`` settings, so a translator can start from a pre-trained encoder of its recipe; a checkpoint alone rebuilds them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from attnkit.checkpoint import Checkpoint
from attnkit.config import ExperimentConfig, TokenizerConfig, from_dict
from attnkit.data.text import ParallelTextDataset
from attnkit.supervision import TranslationGold
from attnkit.vocab import SubwordModel, Tokenizer, Vocabulary, normalise


@dataclass(frozen=True)
class TextPipeline:
    """Raw sentences <-> id sequences for one language pair."""

    source_lang: str
    target_lang: str
    source_tokenizer: Tokenizer
    target_tokenizer: Tokenizer
    source_vocab: Vocabulary
    target_vocab: Vocabulary
    max_source_length: int

    @classmethod
    def build(
        cls, config: ExperimentConfig, train_pairs: list[tuple[str, str]], source_lang: str, target_lang: str, more_targets: Sequence[str] = ()
    ) -> "TextPipeline":
        """Vocabularies (and subword models) from the training pairs; ``more_targets``: other target-language
        text for the target side (a joint model's captions)."""
        data = config.data
        sources = [source for source, _ in train_pairs]
        targets = [*(target for _, target in train_pairs), *more_targets]
        if data.tokenizer.kind == Tokenizer.SUBWORDS:
            source_tokenizer, target_tokenizer = subword_tokenizers(data.tokenizer, source_lang, target_lang, sources, targets)
            source_vocab, target_vocab = (Vocabulary.from_subwords(t.subwords) for t in (source_tokenizer, target_tokenizer))
        else:
            source_tokenizer, target_tokenizer = Tokenizer(data.tokenizer, source_lang), Tokenizer(data.tokenizer, target_lang)
            source_vocab = Vocabulary.build(map(source_tokenizer.tokenize, sources), data.min_freq, data.max_vocab)
            target_vocab = Vocabulary.build(map(target_tokenizer.tokenize, targets), data.min_freq, data.max_vocab)
        return cls(source_lang, target_lang, source_tokenizer, target_tokenizer, source_vocab, target_vocab, data.max_source_length)

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint) -> "TextPipeline":
        config = from_dict(ExperimentConfig, checkpoint.config)
        languages = checkpoint.config["data"]
        source_lang, target_lang = languages["source_lang"], languages["target_lang"]
        subwords = {side: SubwordModel(proto) for side, proto in checkpoint.subword_models.items()}  # checked against the vocabularies on load
        return cls(
            source_lang,
            target_lang,
            Tokenizer(config.data.tokenizer, source_lang, subwords.get("source")),
            Tokenizer(config.data.tokenizer, target_lang, subwords.get("target")),
            Vocabulary(checkpoint.vocabularies["source"]),
            Vocabulary(checkpoint.vocabularies["target"]),
            config.data.max_source_length,
        )

    @property
    def vocabularies(self) -> dict[str, list[str]]:
        return {"source": self.source_vocab.to_list(), "target": self.target_vocab.to_list()}

    @property
    def source_unit(self) -> str:
        """What ``max_source_length`` counts, in a message: words, or a subword model's pieces."""
        return "words" if self.source_tokenizer.subwords is None else "subword pieces"

    @property
    def subword_models(self) -> dict[str, bytes]:
        """The serialised subword model of each side (none for word-level tokenisers): checkpoints carry them."""
        tokenizers = {"source": self.source_tokenizer, "target": self.target_tokenizer}
        return {side: t.subwords.proto for side, t in tokenizers.items() if t.subwords is not None}

    def encode_pairs(self, pairs: list[tuple[str, str]], max_source: int, max_target: int, gold_of: TranslationGold | None = None) -> ParallelTextDataset:
        """Training pairs as ids; pairs with an empty side or over the length limits are skipped.
        ``gold_of`` gives a pair's gold attention from its words (attention supervision)."""
        sources, targets, gold = [], [], []
        for source, target in pairs:
            source_words = self.source_tokenizer.tokenize(source)
            target_words = self.target_tokenizer.tokenize(target)
            if 0 < len(source_words) <= max_source and 0 < len(target_words) <= max_target:
                sources.append(self.source_vocab.encode(source_words))
                targets.append(self.target_vocab.encode(target_words, add_bos=True, add_eos=True))
                gold.append(gold_of(source_words, target_words) if gold_of is not None else None)
        return ParallelTextDataset(sources, targets, gold if gold_of is not None else None)


def describe_subwords(config: TokenizerConfig) -> str:
    """" (unigram subwords, joint)" for a log line; empty for word-level tokenisers."""
    if config.kind != Tokenizer.SUBWORDS:
        return ""
    return f" ({config.algorithm} subwords{', joint' if config.joint else ''}{'' if config.lowercase else ', cased'})"


def subword_tokenizers(
    config: TokenizerConfig, source_lang: str, target_lang: str, sources: Sequence[str], targets: Sequence[str]
) -> tuple[Tokenizer, Tokenizer]:
    """Source and target tokenisers with sentencepiece models trained on the training text (one model
    for both sides when ``config.joint``)."""

    def train(texts: Sequence[str], what: str) -> SubwordModel:
        return SubwordModel.train([normalise(text, config) for text in texts], config.algorithm, config.vocab_size, what)

    if config.joint:
        source_model = target_model = train([*sources, *targets], f"joint {source_lang}+{target_lang}")
    else:
        source_model, target_model = train(sources, source_lang), train(targets, target_lang)
    return Tokenizer(config, source_lang, source_model), Tokenizer(config, target_lang, target_model)
