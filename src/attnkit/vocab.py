"""Vocabularies and tokenisers.

A :class:`Vocabulary` maps words to ids with four fixed specials (``<pad>`` 0,
``<unk>`` 1, ``<bos>`` 2, ``<eos>`` 3) and serialises to a plain list, so it is
saved inside checkpoints. A :class:`Tokenizer` turns raw text into words and
back (sacremoses Moses rules, nltk's download-free word tokenizer, or spaces),
or into the subword pieces of a :class:`SubwordModel` (sentencepiece), whose
trained model travels inside the checkpoint as bytes.
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace
from functools import cached_property

from attnkit.config import SUBWORD_TOKENIZER, TOKENIZERS, TokenizerConfig
from attnkit.errors import UserError, first_line

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<bos>", "<eos>"
SPECIALS = (PAD, UNK, BOS, EOS)


class Vocabulary:
    pad_index, unk_index, bos_index, eos_index = range(4)
    never_output = (pad_index, bos_index)  # ids decode() drops, so search never emits them (an output word per attention row)

    def __init__(self, words: Sequence[str]):
        if tuple(words[: len(SPECIALS)]) != SPECIALS:
            raise ValueError(f"a vocabulary starts with the specials {SPECIALS}")
        self.words: list[str] = list(words)
        self.index = {word: i for i, word in enumerate(self.words)}
        if len(self.index) != len(self.words):
            raise ValueError("vocabulary words must be unique")

    @classmethod
    def build(cls, sentences: Iterable[Sequence[str]], min_freq: int = 1, max_size: int = 0) -> "Vocabulary":
        """Words seen at least ``min_freq`` times, most frequent first (ties alphabetical, so builds are reproducible)."""
        counts = Counter(word for sentence in sentences for word in sentence)
        for special in SPECIALS:
            counts.pop(special, None)
        kept = sorted((w for w, c in counts.items() if c >= min_freq), key=lambda w: (-counts[w], w))
        if max_size > 0:
            kept = kept[:max_size]
        return cls([*SPECIALS, *kept])

    def __len__(self) -> int:
        return len(self.words)

    @property
    def output_size(self) -> int:
        """The tokens a search may output: every one but ``never_output``'s."""
        return len(self) - len(self.never_output)

    def check_beam(self, beam: int, what: str = "the beam") -> None:
        """Refuse a beam wider than the tokens a search can output: its first step fills no more beams than that, and
        each step scores beam x vocabulary candidates per sentence (100,000 x 1,000 is 400 MB a sentence)."""
        if beam > self.output_size:
            raise UserError(f"{what} {beam:,} is wider than the {self.output_size:,} tokens this model can output: give at most that (beams of 1 to 10 are usual)")

    def __contains__(self, word: str) -> bool:
        return word in self.index

    def encode(self, words: Sequence[str], add_bos: bool = False, add_eos: bool = False) -> list[int]:
        ids = [self.index.get(word, self.unk_index) for word in words]
        return [self.bos_index] * add_bos + ids + [self.eos_index] * add_eos

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Words of ``ids``, stopping at ``<eos>`` and dropping ``<bos>``/``<pad>``."""
        words = []
        for i in ids:
            if i == self.eos_index:
                break
            if i not in self.never_output:
                words.append(self.words[i])
        return words

    @classmethod
    def from_subwords(cls, model: "SubwordModel") -> "Vocabulary":
        """The subword model's pieces, in its id order (its ids are this vocabulary's)."""
        return cls(model.pieces)

    def to_list(self) -> list[str]:
        return list(self.words)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.words == other.words


class SubwordModel:
    """A trained sentencepiece model: text <-> subword pieces.

    Trained with attnkit's four specials at ids 0-3 (``<pad> <unk> <bos> <eos>``), so its piece list is a
    :class:`Vocabulary` with the same ids. ``proto`` (the serialised model) is what checkpoints store.
    """

    def __init__(self, proto: bytes):
        import sentencepiece

        self.proto = bytes(proto)
        self.processor = sentencepiece.SentencePieceProcessor()
        try:
            self.processor.LoadFromSerializedProto(self.proto)
        except (RuntimeError, OSError):  # bytes that are no sentencepiece model
            raise UserError("not a valid sentencepiece model: the bytes do not parse") from None
        if self.pieces[: len(SPECIALS)] != list(SPECIALS):
            raise UserError(f"this sentencepiece model was not trained by attnkit (its first pieces are not {' '.join(SPECIALS)})")

    @classmethod
    def train(cls, sentences: Sequence[str], algorithm: str, vocab_size: int, what: str) -> "SubwordModel":
        """A model of ``vocab_size`` pieces (specials included) trained on ``sentences`` (normalised already)."""
        import sentencepiece

        if not any(sentence.strip() for sentence in sentences):
            raise UserError(f"cannot train the {what} subword model: no training text")
        written = io.BytesIO()
        try:
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=iter(sentences),
                model_writer=written,
                model_type=algorithm,
                vocab_size=vocab_size,
                character_coverage=1.0,  # every character of the training text gets a piece: no <unk> for rare letters
                pad_id=0, unk_id=1, bos_id=2, eos_id=3,
                pad_piece=PAD, unk_piece=UNK, bos_piece=BOS, eos_piece=EOS,
                num_threads=1,  # the same model on every rank of a distributed run, whatever the machine
                minloglevel=2,  # its progress lines would drown the training log
            )
        except RuntimeError as error:
            message = first_line(error).split("] ", 1)[-1][:300]  # without sentencepiece's "INTERNAL: file(line) [check] "
            if "Vocabulary size" in message:  # "Vocabulary size too high (8000). Please set it to a value <= 1836."
                message = message[message.index("Vocabulary size"):]
                raise UserError(f"cannot train the {what} subword model: {message} (data.tokenizer.vocab_size)") from None
            raise UserError(f"cannot train the {what} subword model: {message}") from None
        return cls(written.getvalue())

    @cached_property
    def pieces(self) -> list[str]:
        return [self.processor.IdToPiece(i) for i in range(self.processor.GetPieceSize())]

    def encode(self, text: str) -> list[str]:
        return self.processor.EncodeAsPieces(text)

    def decode(self, pieces: Sequence[str]) -> str:
        """Detokenised text; pieces the model does not know read as its unknown sign (⁇)."""
        return self.processor.DecodeIds([self.processor.PieceToId(piece) for piece in pieces])


def normalise(text: str, config: TokenizerConfig) -> str:
    """The text as tokenising sees it (stripped; lower-cased when the config says so)."""
    text = text.strip()
    return text.lower() if config.lowercase else text


class Tokenizer:
    """Raw text <-> words for one language, as the config says."""

    KINDS = TOKENIZERS  # named once, in config (which cannot import this module)
    SUBWORDS = SUBWORD_TOKENIZER

    def __init__(self, config: TokenizerConfig, lang: str, subwords: SubwordModel | None = None):
        if config.kind not in self.KINDS:
            raise UserError(f"tokenizer kind must be one of {', '.join(self.KINDS)}, got '{config.kind}'")
        if (config.kind == self.SUBWORDS) != (subwords is not None):
            raise ValueError("a sentencepiece tokenizer needs its trained model; the word-level ones take none")
        self.config = config
        self.lang = lang
        self.subwords = subwords

    @cached_property
    def _moses(self):
        from sacremoses import MosesDetokenizer, MosesTokenizer

        return MosesTokenizer(lang=self.lang), MosesDetokenizer(lang=self.lang)

    @cached_property
    def _nltk(self):
        from nltk.tokenize import NLTKWordTokenizer  # needs no downloaded data, unlike word_tokenize

        return NLTKWordTokenizer()

    def tokenize(self, text: str) -> list[str]:
        text = normalise(text, self.config)
        if self.subwords is not None:
            return self.subwords.encode(text)
        if self.config.kind == "moses":
            return self._moses[0].tokenize(text, escape=False, aggressive_dash_splits=False)
        if self.config.kind == "nltk":
            return self._nltk.tokenize(text)
        return text.split()

    def words(self, text: str) -> list[str]:
        """``text``'s words, as caption metrics score them: this tokenizer's tokens, or, where they are subword
        pieces (which are not words), Moses's words (the word tokenizers' default), cased as this tokenizer cases."""
        return (self._word_reader if self.subwords is not None else self).tokenize(text)

    @cached_property
    def _word_reader(self) -> "Tokenizer":
        return Tokenizer(replace(self.config, kind="moses"), self.lang)

    def detokenize(self, words: Sequence[str]) -> str:
        if self.subwords is not None:
            return self.subwords.decode(words)
        if self.config.kind == "moses":
            return self._moses[1].detokenize(list(words))
        if self.config.kind == "nltk":
            from nltk.tokenize.treebank import TreebankWordDetokenizer

            return TreebankWordDetokenizer().detokenize(list(words))
        return " ".join(words)
