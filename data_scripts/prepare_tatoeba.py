"""Prepare Tatoeba English-French sentence pairs as an attnkit translation dataset.

Reads ``fra.txt`` (one pair per line, ``english<TAB>french``) straight from the
manythings.org Anki export ``fra-eng.zip`` (or from a plain ``eng-fra.txt`` /
``fra.txt`` file, as in the PyTorch tutorial's ``data.zip``), optionally applies the
classic PyTorch seq2seq tutorial filter, splits by source sentence and writes the
folder that ``attnkit train`` reads (see ``attnkit.data.text``).

Usage::

    # the embedded demo corpus data/tatoeba-fr-en (the tutorial's pairs, as written in the export)
    python data_scripts/prepare_tatoeba.py --tutorial-filter --keep-text --out data/tatoeba-fr-en

    # the whole corpus, English -> French, raw sentences, 2,000 held out per split
    python data_scripts/prepare_tatoeba.py --source en --target fr --valid 2000 --test 2000 \\
        --out data/tatoeba-en-fr-full

Options:

--zip PATH          the export (default ``$ATTNKIT_DATA/tatoeba-eng-fra/fra-eng.zip``, where
                    ``ATTNKIT_DATA`` defaults to ``../shared/data`` beside the project).
--source/--target   ``fr`` / ``en`` (default French -> English, as in the tutorial).
--tutorial-filter   the tutorial's ``normalizeString`` + ``filterPair``: Unicode -> ASCII (accents
                    stripped through NFD), lower case, ``.!?`` split off with a space, every run of
                    other non-letters replaced by one space; kept when both sides have fewer than
                    10 space-separated words (``len(s.split(' ')) < MAX_LENGTH``) and the English
                    side starts with one of ``ENG_PREFIXES`` ("i am ", "he s ", ...). The written
                    sentences are the normalised ones (e.g. "I'm tired." -> "i m tired .").
                    Without it, the raw sentences are written as they are (whitespace-stripped).
--keep-text         with --tutorial-filter: keep the pairs the tutorial keeps, but write them as the
                    export has them (case, accents, apostrophes and punctuation: "I'm tired.").
--max-pairs N       keep at most N pairs in all (a random selection of whole source-sentence groups).
--valid N --test N  pairs held out for validation and test (default 500 each).
--seed S            shuffling seed (default 0); the same input, options and seed give the same files.

The split is proper, unlike the tutorial's (which trains and samples from one list): exact duplicate
pairs are dropped, pairs are grouped by source sentence, and whole groups are dealt to valid, test
and train, so a source sentence of valid or test never appears in train (several reference
translations of one source sentence stay together in one split).

Licence: the pairs are from the Tatoeba Project (https://tatoeba.org) via
www.manythings.org/anki, CC BY 2.0 FR; ``dataset.json`` records the attribution.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import re
import shlex
import sys
import unicodedata
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
try:
    from attnkit.data.sources import clean, default_data_root
    from attnkit.data.text import write_parallel_dataset
    from attnkit.errors import UserError, run_cli
except ImportError:  # run from a checkout where attnkit is not installed
    sys.path.insert(0, str(PROJECT_ROOT / "src"))
    from attnkit.data.sources import clean, default_data_root
    from attnkit.data.text import write_parallel_dataset
    from attnkit.errors import UserError, run_cli

COLUMNS = {"en": 0, "fr": 1}  # field of each language in a line of fra.txt
MEMBER_NAMES = ("fra.txt", "eng-fra.txt")  # manythings.org export; the PyTorch tutorial's data.zip

# The PyTorch seq2seq tutorial's filter (intermediate_source/seq2seq_translation_tutorial.py).
MAX_LENGTH = 10
ENG_PREFIXES = (
    "i am ", "i m ",
    "he is", "he s ",
    "she is", "she s ",
    "you are", "you re ",
    "we are", "we re ",
    "they are", "they re ",
)

SOURCE_URL = "https://www.manythings.org/anki/"
LICENSE = "CC BY 2.0 FR (https://creativecommons.org/licenses/by/2.0/fr/)"
ATTRIBUTION = (
    "Sentence pairs from the Tatoeba Project (https://tatoeba.org), "
    "via www.manythings.org/anki (https://www.manythings.org/anki/)"
)


# ---------------------------------------------------------------- the tutorial's filter


def unicode_to_ascii(text: str) -> str:
    """Drop combining marks after NFD decomposition (the tutorial's ``unicodeToAscii``)."""
    return "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")


def normalize_string(text: str) -> str:
    """The tutorial's ``normalizeString``: lower case, ASCII, ``.!?`` split off, other non-letters -> space.

    Like the tutorial's, the result is not stripped (a leading quote leaves a leading space);
    the length test below counts on it as the tutorial does, and the writer strips each line.
    """
    text = unicode_to_ascii(text.lower().strip())
    text = re.sub(r"([.!?])", r" \1", text)
    return re.sub(r"[^a-zA-Z.!?]+", r" ", text)


def keep_pair(english: str, french: str) -> bool:
    """The tutorial's ``filterPair`` on normalised sentences."""
    return (
        len(french.split(" ")) < MAX_LENGTH
        and len(english.split(" ")) < MAX_LENGTH
        and english.startswith(ENG_PREFIXES)
    )


def tutorial_filter(pairs: Iterable[tuple[str, str]], keep_text: bool = False) -> list[tuple[str, str]]:
    """The (english, french) pairs the tutorial keeps: normalised, or as given when ``keep_text``."""
    kept = []
    for english, french in pairs:
        normalised = normalize_string(english), normalize_string(french)
        if keep_pair(*normalised):
            kept.append((english, french) if keep_text else normalised)
    return kept


# ---------------------------------------------------------------- reading


def read_text(path: Path) -> tuple[str, str, dict]:
    """Text of the pair file in ``path`` (a zip holding fra.txt, or the text file itself), its name, extra info."""
    if not path.exists():
        raise UserError(f"Tatoeba file not found: {path} (give --zip PATH, or set ATTNKIT_DATA)")
    if not path.is_file():
        raise UserError(f"{path} is not a file (give --zip the path of fra-eng.zip)")
    extra: dict = {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                members = {Path(name).name: name for name in archive.namelist() if not name.endswith("/")}
                member = next((members[n] for n in MEMBER_NAMES if n in members), None)
                if member is None:
                    raise UserError(
                        f"{path} holds no {' or '.join(MEMBER_NAMES)} (it has: {', '.join(sorted(members)) or 'nothing'})"
                    )
                data = archive.read(member)
                if "_about.txt" in members:
                    about = archive.read(members["_about.txt"]).decode("utf-8", errors="replace")
                    date = re.search(r"Date of this file:\s*(\S+)", about)
                    if date:
                        extra["export_date"] = date.group(1)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, RuntimeError, NotImplementedError) as error:  # the last two: an encrypted member, a compression zipfile lacks
            raise UserError(f"cannot read {path}: {error}") from None
        name = f"{path.name}:{member}"
    elif path.suffix == ".zip":
        raise UserError(f"{path} is not a valid zip file")
    else:
        data, name = path.read_bytes(), path.name
    try:
        return data.decode("utf-8"), name, extra
    except UnicodeDecodeError as error:
        raise UserError(f"{name} is not UTF-8 text ({error})") from None


def parse_pairs(text: str, name: str) -> list[tuple[str, str]]:
    """(english, french) per line; later fields (newer exports add an attribution column) are ignored."""
    pairs = []
    for number, line in enumerate(text.split("\n"), 1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 2:
            raise UserError(f"{name}, line {number}: expected 'english<TAB>french', found no tab")
        pairs.append((fields[0], fields[1]))
    if not pairs:
        raise UserError(f"{name} holds no sentence pairs")
    return pairs


# ---------------------------------------------------------------- splitting


def split_by_source(
    pairs: Sequence[tuple[str, str]],
    valid_size: int,
    test_size: int,
    seed: int,
    max_pairs: int | None = None,
) -> dict[str, list[tuple[str, str]]]:
    """Deal whole source-sentence groups, in a seeded random order, to valid, test and train.

    A group goes to the first of valid, test that it fits in whole, else to train while the
    ``max_pairs`` budget lasts; so valid and test get exactly their sizes (enough small groups
    exist in practice) and no source sentence is in two splits.
    """
    groups: dict[str, list[str]] = {}
    for source, target in pairs:
        groups.setdefault(source, []).append(target)
    keys = list(groups)
    random.Random(seed).shuffle(keys)
    quota = {"valid": valid_size, "test": test_size}
    train_budget = len(pairs) if max_pairs is None else max_pairs - valid_size - test_size
    splits: dict[str, list[tuple[str, str]]] = {"train": [], "valid": [], "test": []}
    for key in keys:
        group = [(key, target) for target in groups[key]]
        for name in ("valid", "test"):
            if len(splits[name]) + len(group) <= quota[name]:
                splits[name].extend(group)
                break
        else:
            if len(splits["train"]) + len(group) <= train_budget:
                splits["train"].extend(group)
    for name, size in quota.items():
        if len(splits[name]) != size:
            raise UserError(f"could not fill {name} with {size} pairs from whole source-sentence groups; ask for fewer")
    return splits


# ---------------------------------------------------------------- command line


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Prepare Tatoeba English-French pairs (manythings.org fra-eng.zip) as an attnkit translation dataset.",
    )
    parser.add_argument("--zip", type=Path, default=None, help="fra-eng.zip (or a plain fra.txt / eng-fra.txt); default $ATTNKIT_DATA/tatoeba-eng-fra/fra-eng.zip")
    parser.add_argument("--out", type=Path, required=True, help="output folder (created; its dataset files are replaced)")
    parser.add_argument("--source", default="fr", help="source language: fr or en (default fr)")
    parser.add_argument("--target", default="en", help="target language: en or fr (default en)")
    parser.add_argument("--tutorial-filter", action="store_true", help="the PyTorch seq2seq tutorial's normalisation and filter (short 'i am / he is ...' pairs)")
    parser.add_argument("--keep-text", action="store_true", help="with --tutorial-filter: write the kept pairs as the export has them (cased, with accents and apostrophes)")
    parser.add_argument("--max-pairs", type=int, default=None, help="keep at most this many pairs in all (default: all)")
    parser.add_argument("--valid", type=int, default=500, help="validation pairs (default 500)")
    parser.add_argument("--test", type=int, default=500, help="test pairs (default 500; 0: no test split)")
    parser.add_argument("--seed", type=int, default=0, help="shuffling seed (default 0)")
    return parser


def check_options(args: argparse.Namespace) -> None:
    for role in ("source", "target"):
        if getattr(args, role) not in COLUMNS:
            raise UserError(f"--{role} '{getattr(args, role)}' is not available; Tatoeba fra-eng has {' and '.join(COLUMNS)}")
    if args.source == args.target:
        raise UserError(f"source and target language are both '{args.source}'")
    for option in ("valid", "test"):
        if getattr(args, option) < 0:
            raise UserError(f"--{option} must be 0 or more, not {getattr(args, option)}")
    if args.valid == 0:
        raise UserError("--valid must be at least 1: training reads the valid split")
    if args.keep_text and not args.tutorial_filter:
        raise UserError("--keep-text goes with --tutorial-filter (without the filter the sentences are kept as they are anyway)")
    if args.max_pairs is not None and args.max_pairs <= args.valid + args.test:
        raise UserError(f"--max-pairs {args.max_pairs} leaves nothing for training after --valid {args.valid} and --test {args.test}")
    if args.out.exists() and not args.out.is_dir():
        raise UserError(f"--out {args.out} exists and is not a folder")


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    check_options(args)
    path = args.zip if args.zip is not None else default_data_root(PROJECT_ROOT) / "tatoeba-eng-fra" / "fra-eng.zip"
    text, name, extra = read_text(path)
    raw = parse_pairs(text, name)  # (english, french)

    if args.tutorial_filter:
        english_french = tutorial_filter(raw, keep_text=args.keep_text)
    else:
        english_french = [(clean(english), clean(french)) for english, french in raw]
    # The writer strips lines; anything splitlines() would break on must not survive either.
    english_french = [(clean(english), clean(french)) for english, french in english_french]
    columns = (COLUMNS[args.source], COLUMNS[args.target])
    oriented = [(pair[columns[0]], pair[columns[1]]) for pair in english_french]
    nonempty = [pair for pair in oriented if pair[0] and pair[1]]
    unique = list(dict.fromkeys(nonempty))
    if len(unique) <= args.valid + args.test:
        raise UserError(
            f"only {len(unique)} pairs remain after {'the tutorial filter and ' if args.tutorial_filter else ''}"
            f"deduplication; --valid {args.valid} and --test {args.test} would leave nothing for training"
        )
    splits = split_by_source(unique, args.valid, args.test, args.seed, args.max_pairs)
    if not args.test:  # --test 0: no test split, rather than an empty one that scores nothing
        del splits["test"]

    command = ["python", "data_scripts/prepare_tatoeba.py", *(sys.argv[1:] if argv is None else argv)]
    info = {
        "name": f"tatoeba-{args.source}-{args.target}" + ("-tutorial" if args.tutorial_filter else ""),
        "source": f"Tatoeba English-French pairs, manythings.org Anki export ({name}"
        + (f", dated {extra['export_date']}" if "export_date" in extra else "")
        + f", sha256 {extra['sha256']})",
        "source_url": SOURCE_URL,
        "license": LICENSE,
        "attribution": ATTRIBUTION,
        "command": shlex.join(command),
        "options": {
            "source": args.source,
            "target": args.target,
            "tutorial_filter": args.tutorial_filter,
            "keep_text": args.keep_text,
            "max_pairs": args.max_pairs,
            "valid": args.valid,
            "test": args.test,
            "seed": args.seed,
        },
        "preprocessing": (
            "PyTorch seq2seq tutorial normalizeString (NFD accent stripping, lower case, '.!?' split off, "
            f"other non-letters -> space) and filterPair (< {MAX_LENGTH} words on both sides, English starts "
            "with one of eng_prefixes) select the pairs; sentences are stored "
            + ("as in the export (whitespace-stripped)" if args.keep_text else "normalised")
            if args.tutorial_filter
            else "none: raw sentences, whitespace-stripped"
        ),
        "split": "exact duplicate pairs dropped; whole source-sentence groups dealt to valid, test, train in a seeded random order",
        "counts": {
            "input_pairs": len(raw),
            "after_filter": len(english_french),
            "empty_dropped": len(oriented) - len(nonempty),
            "duplicates_dropped": len(nonempty) - len(unique),
            "source_sentences": {split: len({s for s, _ in pairs}) for split, pairs in splits.items()},
        },
    }
    if args.tutorial_filter:
        info["options"]["max_length"] = MAX_LENGTH
        info["options"]["eng_prefixes"] = list(ENG_PREFIXES)
    write_parallel_dataset(args.out, (args.source, args.target), splits, info=info)
    counts = ", ".join(f"{split} {len(pairs):,}" for split, pairs in splits.items())
    selection = ", tutorial filter" + (", text as in the export" if args.keep_text else "") if args.tutorial_filter else ""
    print(f"wrote {args.out}: {counts} pairs ({args.source}->{args.target}{selection}, seed {args.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
