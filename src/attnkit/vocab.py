"""Word vocabularies and tokenisers.

A :class:`Vocabulary` maps words to ids with four fixed specials (``<pad>`` 0,
``<unk>`` 1, ``<bos>`` 2, ``<eos>`` 3) and serialises to a plain list, so it is
saved inside checkpoints. A :class:`Tokenizer` turns raw text into words and
back (sacremoses Moses rules, nltk's download-free word tokenizer, or spaces).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from functools import cached_property

from attnkit.config import TokenizerConfig
from attnkit.errors import UserError

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<bos>", "<eos>"
SPECIALS = (PAD, UNK, BOS, EOS)


class Vocabulary:
    pad_index, unk_index, bos_index, eos_index = range(4)

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
            if i not in (self.bos_index, self.pad_index):
                words.append(self.words[i])
        return words

    def to_list(self) -> list[str]:
        return list(self.words)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.words == other.words


class Tokenizer:
    """Raw text <-> words for one language, as the config says."""

    KINDS = ("moses", "nltk", "space")

    def __init__(self, config: TokenizerConfig, lang: str):
        if config.kind not in self.KINDS:
            raise UserError(f"tokenizer kind must be one of {', '.join(self.KINDS)}, got '{config.kind}'")
        self.config = config
        self.lang = lang

    @cached_property
    def _moses(self):
        from sacremoses import MosesDetokenizer, MosesTokenizer

        return MosesTokenizer(lang=self.lang), MosesDetokenizer(lang=self.lang)

    @cached_property
    def _nltk(self):
        from nltk.tokenize import NLTKWordTokenizer  # needs no downloaded data, unlike word_tokenize

        return NLTKWordTokenizer()

    def tokenize(self, text: str) -> list[str]:
        text = text.strip()
        if self.config.lowercase:
            text = text.lower()
        if self.config.kind == "moses":
            return self._moses[0].tokenize(text, escape=False, aggressive_dash_splits=False)
        if self.config.kind == "nltk":
            return self._nltk.tokenize(text)
        return text.split()

    def detokenize(self, words: Sequence[str]) -> str:
        if self.config.kind == "moses":
            return self._moses[1].detokenize(list(words))
        if self.config.kind == "nltk":
            from nltk.tokenize.treebank import TreebankWordDetokenizer

            return TreebankWordDetokenizer().detokenize(list(words))
        return " ".join(words)
