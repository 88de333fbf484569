"""Where the package's one punctuation rule differs from the two it replaced, on the token streams the figures read.

Run from the project root::

    python bench/punctuation_rules.py              # every stream (about a minute on 2 CPU cores: Moses and one sentencepiece model)
    python bench/punctuation_rules.py --scenes 500  # fewer generated scenes per split

Issue 44: two rules said what punctuation is. The word groups of the comparisons (content / function /
punctuation: ``bench/real_attention.py``, ``bench/image_memory.py``, the report of ``attnkit compare``) took a
token without a letter or digit; the head statistics (``docs/bert-heads.png``, ``bench/pretrain.py``) took a piece
whose every character is of Unicode category P once sentencepiece's word mark is set aside. Now
:func:`attnkit.analysis.is_punctuation` serves both. The figures built on the old rules need trained checkpoints to
re-measure; this counts instead, token by token, where the old rule of each figure and the new one disagree on the
streams those figures are computed on (where it is 0 for a figure's own rule on every stream that figure reads, the
figure cannot have moved). Each stream names the rule its figures read (``figures_read``); the other old rule's
disagreements are counted too, though no figure applies that rule there:

* ``flickr8k``: every caption of the shared Flickr8k, tokenised as the joint recipes do (Moses, lower-cased:
  ``tasks/configs/flickr8k_multi30k_transformer.yaml``, the study's target words) and as the captioning recipe does
  (NLTK, lower-cased: ``tasks/configs/flickr8k.yaml``, ``bench/image_memory.py``'s caption study);
* ``multi30k-en``, ``-de``, ``-fr``: every sentence of train, val and test_2016_flickr, Moses, lower-cased (the
  word-level recipes; English is the joint models' target side, whose words are grouped);
* ``multi30k-de-pieces``: the German sentencepiece pieces of ``tasks/configs/multi30k_de_en_transformer.yaml``
  (unigram, 6,000, cased, trained here on the 29,000 training sentences as the recipe does), over the 500
  validation sentences the head figure reads, over every split, and over the vocabulary itself;
* ``scenes``: every phrasing of ``--scenes`` generated scenes per split (English and French words, split on
  spaces as ``tasks/configs/scenes_multitask.yaml`` does).

Human-readable lines first; the LAST line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

from attnkit.analysis import is_punctuation
from attnkit.cli import positive_int
from attnkit.config import load_config
from attnkit.data.captions import read_flickr8k_captions
from attnkit.data.multi30k import SPLITS, read_split
from attnkit.data.scenes import SPLITS as SCENE_SPLITS
from attnkit.data.scenes import generate_scenes
from attnkit.data.sources import default_data_root
from attnkit.errors import UserError, run_cli
from attnkit.vocab import SPECIALS, SubwordModel, Tokenizer, normalise
from machine import busy_cores, print_result

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tasks" / "configs"
HEAD_SENTENCES = 500  # bench/pretrain.py's head figure: the first 500 validation sentences
SHOWN = 12  # changed tokens listed per stream


def old_word_group_rule(token: str) -> bool:
    """The word groups' rule before issue 44 (comparison.word_groups.word_group): no letter or digit."""
    return not any(character.isalnum() for character in token)


def old_head_rule(piece: str) -> bool:
    """The head statistics' rule before issue 44 (analysis.is_punctuation): every character of category P, the word mark aside."""
    import unicodedata

    text = piece.replace("\u2581", "")
    return bool(text) and all(unicodedata.category(character).startswith("P") for character in text)


OLD_RULES = {"word_groups": old_word_group_rule, "head_statistics": old_head_rule}


def count(tokens: Iterable[str], sentences: int, figures_read: str | None) -> dict:
    """Tokens and types of one stream, how many the new rule calls punctuation, and where each old rule differs from
    it; ``figures_read``: the old rule the figures computed on this stream applied (None: no figure asks these
    tokens whether they are punctuation, e.g. source words)."""
    counts = Counter(tokens)
    total = sum(counts.values())
    result = {
        "sentences": sentences, "tokens": total, "types": len(counts), "punctuation_tokens": sum(n for t, n in counts.items() if is_punctuation(t)),
        "figures_read": figures_read,
    }  # fmt: skip
    for name, old in OLD_RULES.items():
        changed = {token: n for token, n in counts.items() if old(token) != is_punctuation(token)}
        tokens_changed = sum(changed.values())
        result[name] = {
            "tokens_changed": tokens_changed,
            "share": round(tokens_changed / total, 6) if total else 0.0,
            "types_changed": len(changed),
            "examples": dict(sorted(changed.items(), key=lambda item: -item[1])[:SHOWN]),  # token -> count
        }
    result["tokens_changed_for_its_figures"] = result[figures_read]["tokens_changed"] if figures_read else None
    return result


def tokenised(sentences: list[str], tokenize: Callable[[str], list[str]], figures_read: str | None = "word_groups") -> dict:
    return count([token for sentence in sentences for token in tokenize(sentence)], len(sentences), figures_read)


def recipe_tokenizer(recipe: str, lang: str) -> Tokenizer:
    return Tokenizer(load_config(CONFIGS / recipe).data.tokenizer, lang)


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="", help="the shared data folder (default: $ATTNKIT_DATA, else ../shared/data)")
    parser.add_argument("--scenes", type=positive_int, default=2000, help="generated scenes per split (default 2000)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    data = Path(args.data) if args.data else default_data_root(ROOT)
    captions_file = data / "flickr8k" / "Flickr8k.token.txt"
    if not captions_file.is_file() or not (data / "multi30k").is_dir():
        raise UserError(f"{data} lacks flickr8k/Flickr8k.token.txt or multi30k/ (give --data, or set ATTNKIT_DATA)")
    busy_before = busy_cores()
    began = time.perf_counter()
    streams: dict[str, dict] = {}

    captions = [caption for texts in read_flickr8k_captions(captions_file).values() for caption in texts]
    streams["flickr8k (moses, joint recipes)"] = tokenised(captions, recipe_tokenizer("flickr8k_multi30k_transformer.yaml", "en").tokenize)
    streams["flickr8k (nltk, captioning recipe)"] = tokenised(captions, recipe_tokenizer("flickr8k.yaml", "en").tokenize)

    multi30k = {stem: dict(zip(("en", "de", "fr"), zip(*read_split(data, stem, ("en", "de", "fr"))))) for stem in SPLITS.values()}
    for lang in ("en", "de", "fr"):
        tokenizer = recipe_tokenizer("multi30k_de_en.yaml", lang)
        figures_read = "word_groups" if lang == "en" else None  # the target words of every comparison are English
        streams[f"multi30k-{lang} (moses)"] = tokenised([s for stem in SPLITS.values() for s in multi30k[stem][lang]], tokenizer.tokenize, figures_read)

    config = load_config(CONFIGS / "multi30k_de_en_transformer.yaml").data.tokenizer
    pieces = SubwordModel.train([normalise(s, config) for s in multi30k["train"]["de"]], config.algorithm, config.vocab_size, "de")
    pieces_tokenizer = Tokenizer(config, "de", pieces)
    validation = list(multi30k["val"]["de"])[:HEAD_SENTENCES]
    streams[f"multi30k-de pieces, head figure ({len(validation)} validation sentences)"] = tokenised(validation, pieces_tokenizer.tokenize, "head_statistics")
    streams["multi30k-de pieces, every split"] = tokenised([s for stem in SPLITS.values() for s in multi30k[stem]["de"]], pieces_tokenizer.tokenize, "head_statistics")
    streams[f"multi30k-de pieces, the vocabulary ({config.vocab_size} pieces, specials aside)"] = count(pieces.pieces[len(SPECIALS):], 0, "head_statistics")

    scene_sentences = [sentence for split in SCENE_SPLITS for scene in generate_scenes(args.scenes, 0, split) for sentence in scene.sentences]
    scene_tokenizer = recipe_tokenizer("scenes_multitask.yaml", "en")
    streams["scenes (english)"] = tokenised([s.english_text for s in scene_sentences], scene_tokenizer.tokenize)
    streams["scenes (french)"] = tokenised([s.french_text for s in scene_sentences], scene_tokenizer.tokenize, None)

    for name, found in streams.items():
        read = found["figures_read"]
        head = f"{name}: {found['tokens']:,} tokens, {found['punctuation_tokens']:,} punctuation; "
        head += f"its figures read the {read} rule: {found['tokens_changed_for_its_figures']} tokens change {found[read]['examples']}" if read else "no figure reads its punctuation"
        others = "; ".join(f"the {rule} rule: {found[rule]['tokens_changed']} {found[rule]['examples']}" for rule in OLD_RULES if rule != read)
        print(f"{head} (not applied here: {others})")
    unchanged = all(found["tokens_changed_for_its_figures"] in (0, None) for found in streams.values())
    print("the figures cannot have moved: no token changes class under the rule its figures read" if unchanged else "some figures may move: see tokens_changed_for_its_figures")
    result = {
        "benchmark": "punctuation_rules",
        "rule": "analysis.is_punctuation: something left once the word mark is set aside, and no letter or digit",
        "scenes_per_split": args.scenes,
        "streams": streams,
        "figures_unchanged": unchanged,
        "seconds": round(time.perf_counter() - began, 1),
    }
    return print_result(result, busy_before)


if __name__ == "__main__":
    sys.exit(run_cli(main))
