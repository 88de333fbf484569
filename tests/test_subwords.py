"""Subword vocabularies (data.tokenizer.kind: sentencepiece): training, round trips, checkpoints, bad input."""

import random
from dataclasses import replace

import pytest
import torch

from attnkit.checkpoint import load_checkpoint, save_checkpoint
from attnkit.config import TokenizerConfig, load_config
from attnkit.data.text import write_parallel_dataset
from attnkit.errors import UserError
from attnkit.text_pipeline import subword_tokenizers
from attnkit.translation import Translator, train_translation
from attnkit.vocab import SubwordModel, Tokenizer, Vocabulary

SUBJECTS = ["The cat", "My brother", "Anna", "Our teacher", "The old man", "Tom's dog"]
VERBS = ["sees", "doesn't like", "is painting", "waits for", "found"]
OBJECTS = ["the garden.", "a red bicycle!", "the children, again.", "Berlin?", "an apple."]
FRENCH = {"The cat": "Le chat", "My brother": "Mon frère", "Anna": "Anna", "Our teacher": "Notre professeur",
          "The old man": "Le vieil homme", "Tom's dog": "Le chien de Tom", "sees": "voit", "doesn't like": "n'aime pas",
          "is painting": "peint", "waits for": "attend", "found": "a trouvé", "the garden.": "le jardin.",
          "a red bicycle!": "un vélo rouge !", "the children, again.": "les enfants, encore.", "Berlin?": "Berlin ?",
          "an apple.": "une pomme."}  # fmt: skip


def cased_pair(rng: random.Random) -> tuple[str, str]:
    parts = [rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS)]
    return " ".join(FRENCH[p] for p in parts), " ".join(parts)


@pytest.fixture(scope="module")
def cased_data(tmp_path_factory):
    """A tiny cased French -> English corpus with apostrophes and punctuation."""
    rng = random.Random(0)
    splits = {"train": [cased_pair(rng) for _ in range(400)], "valid": [cased_pair(rng) for _ in range(20)], "test": [cased_pair(rng) for _ in range(20)]}
    return write_parallel_dataset(tmp_path_factory.mktemp("cased"), ("fr", "en"), splits)


def subword_config(vocab_size: int = 45, **settings) -> TokenizerConfig:
    return TokenizerConfig(**{"kind": "sentencepiece", "lowercase": False, "vocab_size": vocab_size, **settings})


def english_sentences() -> list[str]:
    rng = random.Random(1)
    return [cased_pair(rng)[1] for _ in range(300)]


@pytest.mark.parametrize("algorithm", ["unigram", "bpe"])
def test_round_trip_keeps_case_and_punctuation(algorithm):
    model = SubwordModel.train(english_sentences(), algorithm, 45, "English")
    tokenizer = Tokenizer(subword_config(algorithm=algorithm), "en", model)
    for text in ["Tom's dog doesn't like Berlin?", "The children, again. Anna found a red bicycle!"]:
        pieces = tokenizer.tokenize(text)
        assert len(pieces) > len(text.split())  # subwords, not words
        assert tokenizer.detokenize(pieces) == text


def test_the_vocabulary_is_the_models_pieces_with_attnkits_specials_first():
    model = SubwordModel.train(english_sentences(), "unigram", 45, "English")
    vocab = Vocabulary.from_subwords(model)
    assert len(vocab) == 45 and vocab.words[:4] == ["<pad>", "<unk>", "<bos>", "<eos>"]
    pieces = model.encode("Anna sees the garden.")
    assert vocab.encode(pieces) == [model.processor.PieceToId(piece) for piece in pieces]


def test_training_is_deterministic_so_every_rank_of_a_distributed_run_builds_the_same_model():
    first, again = (SubwordModel.train(english_sentences(), "unigram", 45, "English") for _ in range(2))
    assert first.proto == again.proto


def test_a_word_never_seen_becomes_known_pieces_not_unk():
    model = SubwordModel.train(english_sentences(), "unigram", 45, "English")
    vocab = Vocabulary.from_subwords(model)
    ids = vocab.encode(model.encode("Berliner bicycles"))  # neither word is in the training text
    assert len(ids) >= 2 and vocab.unk_index not in ids


def test_joint_model_serves_both_sides_and_separate_models_differ():
    rng = random.Random(2)
    pairs = [cased_pair(rng) for _ in range(300)]
    sources, targets = [s for s, _ in pairs], [t for _, t in pairs]
    source, target = subword_tokenizers(subword_config(70, joint=True), "fr", "en", sources, targets)
    assert source.subwords is target.subwords
    source, target = subword_tokenizers(subword_config(45), "fr", "en", sources, targets)
    assert source.subwords.pieces != target.subwords.pieces
    assert "è" in "".join(source.subwords.pieces) and "è" not in "".join(target.subwords.pieces)  # each side's own text


def test_lowercase_applies_before_the_subword_model():
    sentences = english_sentences()
    source, _ = subword_tokenizers(subword_config(40, lowercase=True), "en", "en", sentences, sentences)
    assert all(piece == piece.lower() for piece in source.subwords.pieces[4:])
    assert source.detokenize(source.tokenize("Anna FOUND the garden.")) == "anna found the garden."


@pytest.fixture(scope="module")
def subword_run(cased_data, tmp_path_factory):
    folder = tmp_path_factory.mktemp("subword-run")
    config = load_config(None, [
        f"data.path={cased_data}", f"output_dir={folder}", "data.tokenizer.kind=sentencepiece", "data.tokenizer.lowercase=false",
        "data.tokenizer.vocab_size=45", "text_encoder.embedding_size=8", "text_encoder.hidden_size=8",
        "decoder.embedding_size=8", "decoder.hidden_size=16", "decoder.attention_size=8", "train.epochs=1", "train.batch_size=32",
        "search.beam_size=2",
    ])  # fmt: skip
    train_translation(config, progress_bar=False, log=lambda _: None)
    return folder / "best.pt"


def test_the_checkpoint_carries_the_subword_models_and_loads_without_pickled_code(subword_run, tmp_path):
    raw = torch.load(subword_run, weights_only=True)  # bytes and lists only
    assert set(raw["subword_models"]) == {"source", "target"} and isinstance(raw["subword_models"]["source"], bytes)
    sentences = ["Anna n'aime pas Berlin ?", "Le chien de Tom voit un vélo rouge !"]
    before = [best[0].text for best in Translator.from_checkpoint(subword_run, device="cpu").translate(sentences)]
    copy = save_checkpoint(tmp_path / "copy.pt", load_checkpoint(subword_run))
    after = [best[0].text for best in Translator.from_checkpoint(copy, device="cpu").translate(sentences)]
    assert after == before and all(isinstance(text, str) for text in after)


def test_the_translator_reads_an_unseen_word_as_known_pieces(subword_run):
    translator = Translator.from_checkpoint(subword_run, device="cpu")
    best = translator.translate(["Anna voit Berlinerin."])[0][0]  # "Berlinerin" is in no training sentence
    vocab = translator.pipeline.source_vocab
    assert len(best.source_words) > 3 and vocab.unk_index not in vocab.encode(best.source_words)


def test_a_cut_sentence_s_warning_counts_pieces_not_words(subword_run, capsys):
    """max_source_length counts a subword model's pieces: 20 long words were "more than 50 words"."""
    from attnkit.commands import translate

    translator = Translator.from_checkpoint(subword_run, device="cpu")
    sentence = " ".join(["Berlinerinnen"] * 20)
    assert len(translator.translate([sentence])[0][0].source_words) == translator.pipeline.max_source_length
    assert translate.main(["--checkpoint", str(subword_run), sentence]) == 0
    assert capsys.readouterr().err == f"warning: sentence 1 has more than {translator.pipeline.max_source_length} subword pieces; only the first {translator.pipeline.max_source_length} were read\n"


def test_characters_never_seen_in_training_do_not_crash_translation(subword_run):
    translator = Translator.from_checkpoint(subword_run, device="cpu")
    best = translator.translate(["Anna voit 東京 et Zoë ☃"])[0][0]
    assert best.error is None and "<unk>" not in best.text


def test_a_subword_model_that_does_not_match_the_checkpoint_is_refused(subword_run, tmp_path):
    checkpoint = load_checkpoint(subword_run)
    other = SubwordModel.train(english_sentences(), "bpe", 45, "English").proto
    swapped = save_checkpoint(tmp_path / "swapped.pt", replace(checkpoint, subword_models={**checkpoint.subword_models, "target": other}))
    with pytest.raises(UserError, match="target sentencepiece model does not match"):
        load_checkpoint(swapped)
    missing = save_checkpoint(tmp_path / "missing.pt", replace(checkpoint, subword_models={}))
    with pytest.raises(UserError, match="subword models"):
        load_checkpoint(missing)
    garbage = save_checkpoint(tmp_path / "garbage.pt", replace(checkpoint, subword_models={**checkpoint.subword_models, "source": b"\x00not a model"}))
    with pytest.raises(UserError, match="source subword model"):
        load_checkpoint(garbage)


def test_a_vocabulary_larger_than_the_corpus_allows_says_what_to_set():
    with pytest.raises(UserError, match=r"Vocabulary size too high \(5000\).*<= \d+.*data.tokenizer.vocab_size"):
        SubwordModel.train(english_sentences(), "unigram", 5000, "English")


def test_an_empty_training_split_is_one_clear_message():
    with pytest.raises(UserError, match="no training text"):
        SubwordModel.train(["", "  "], "unigram", 45, "English")


def test_captioning_keeps_words():
    with pytest.raises(UserError, match="captioning model reads words"):
        load_config(None, ["task=captioning", "data.tokenizer.kind=sentencepiece"])


def test_a_joint_model_s_subword_captions_are_scored_as_words():
    """A joint model may caption in subword pieces; BLEU, CIDEr-D and SCST's reward read words, as its references
    are read, never pieces. A word-level captioner's tokens are its words, scored as they are."""
    from attnkit.captioning import CaptionPipeline
    from attnkit.metrics import caption_scores

    model = SubwordModel.train(english_sentences(), "unigram", 45, "English")
    tokenizer = Tokenizer(subword_config(), "en", model)
    pipeline = CaptionPipeline(tokenizer, Vocabulary(model.pieces), "en")
    caption = "Tom's dog doesn't like the garden."
    pieces = tokenizer.tokenize(caption)
    assert len(pieces) > len(caption.split())  # pieces, not words
    words = ["Tom", "'s", "dog", "doesn", "'t", "like", "the", "garden", "."]  # Moses's words, cased as the tokenizer cases
    assert pipeline.scored_words(pieces) == tokenizer.words(caption) == words
    other = "The cat sees an apple."
    scores = caption_scores([pipeline.scored_words(tokenizer.tokenize(other))], [[tokenizer.words(other)]], meteor=False)
    assert scores["bleu4"] == pytest.approx(100.0)
    word_level = CaptionPipeline(Tokenizer(TokenizerConfig(kind="space"), "en"), Vocabulary.build([["a", "dog"]]), "en")
    assert word_level.scored_words(["a", "dog"]) == ["a", "dog"] and word_level.tokenizer.words("a dog") == ["a", "dog"]
