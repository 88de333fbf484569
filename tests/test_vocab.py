import pytest

from attnkit.config import TokenizerConfig
from attnkit.errors import UserError
from attnkit.vocab import SPECIALS, Tokenizer, Vocabulary


def test_build_keeps_frequent_words_with_specials_first():
    vocab = Vocabulary.build([["a", "b", "a"], ["c", "a", "b"]], min_freq=2)
    assert vocab.words == [*SPECIALS, "a", "b"]
    assert vocab.encode(["a", "c"], add_bos=True, add_eos=True) == [2, 4, 1, 3]
    assert vocab.decode([2, 4, 5, 3, 4]) == ["a", "b"]
    assert Vocabulary(vocab.to_list()) == vocab


def test_max_size_and_deterministic_ties():
    vocab = Vocabulary.build([["z", "y", "x", "x"]], max_size=2)
    assert vocab.words[4:] == ["x", "y"]


@pytest.mark.parametrize("kind", ["moses", "nltk", "space"])
def test_tokenizers_round_trip_simple_text(kind):
    tokenizer = Tokenizer(TokenizerConfig(kind=kind, lowercase=True), "en")
    words = tokenizer.tokenize("  The cat, it sat. ")
    assert words[:2] == ["the", "cat,"] if kind == "space" else words[:3] == ["the", "cat", ","]
    assert tokenizer.detokenize(words) == "the cat, it sat."


def test_moses_keeps_french_elisions_and_accents():
    tokenizer = Tokenizer(TokenizerConfig(kind="moses", lowercase=False), "fr")
    assert tokenizer.tokenize("J'ai vu l'été.") == ["J'", "ai", "vu", "l'", "été", "."]


def test_unknown_tokenizer_kind():
    with pytest.raises(UserError, match="tokenizer kind"):
        Tokenizer(TokenizerConfig(kind="bpe"), "en")
