"""data_scripts/prepare_tatoeba.py, data_scripts/prepare_multi30k.py and the embedded demo corpus."""

from __future__ import annotations

import gzip
import importlib.util
import json
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from attnkit.data.folder import read_dataset_info
from attnkit.data.text import read_parallel, resolve_languages
from attnkit.errors import UserError, run_cli
from conftest import needs_shared, shared_data_root

ROOT = Path(__file__).resolve().parents[1]
EMBEDDED = ROOT / "data" / "tatoeba-fr-en"


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"_data_scripts_{name}", ROOT / "data_scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tatoeba = load_script("prepare_tatoeba")
multi30k = load_script("prepare_multi30k")


def sources(pairs):
    return {source for source, _ in pairs}


# ---------------------------------------------------------------- the tutorial's filter


@pytest.mark.parametrize(
    "raw, normalised",
    [
        ("I'm tired.", "i m tired ."),
        ("Je suis fatigué.", "je suis fatigue ."),
        ("Va !", "va !"),
        ("Ça alors\u202f!", "ca alors !"),
        ("Qu'est-ce que c'est ?", "qu est ce que c est ?"),
        ("  He's 20 years old!  ", "he s years old !"),
        ('"Wait..."', " wait . . . "),  # like the tutorial's: not stripped
    ],
)
def test_normalize_string_matches_the_tutorial(raw, normalised):
    assert tatoeba.normalize_string(raw) == normalised


def test_tutorial_filter_keeps_short_pairs_with_an_english_prefix():
    pairs = [
        ("I'm tired.", "Je suis fatigué."),
        ("Hello.", "Bonjour."),  # no prefix
        ("She's very happy!", "Elle est très heureuse !"),
        ("They are all here.", "Ils sont tous là."),
        ("Hey, I am here.", "Hé, je suis là."),  # prefix not at the start
        ("I am not sure what he is doing.", "Je ne sais pas ce qu'il fait."),  # 9 tokens with the ".": kept
        ("I am not sure what he is doing now.", "Je ne sais pas ce qu'il fait."),  # 10 tokens: dropped
        ("I am here.", "Je suis ici avec mes amis et ma famille ce soir."),  # French too long
        ('"I am here."', "« Je suis là. »"),  # leading quote -> leading space: dropped, as in the tutorial
        ("Hero is here.", "Le héros est là."),  # "he" alone is no prefix ("he is" / "he s ")
    ]
    assert tatoeba.tutorial_filter(pairs) == [
        ("i m tired .", "je suis fatigue ."),
        ("she s very happy !", "elle est tres heureuse !"),
        ("they are all here .", "ils sont tous la ."),
        ("i am not sure what he is doing .", "je ne sais pas ce qu il fait ."),
    ]
    assert tatoeba.tutorial_filter(pairs, keep_text=True) == [pairs[i] for i in (0, 2, 3, 5)]  # the same pairs, as written


# ---------------------------------------------------------------- splitting


def grouped_pairs():
    """120 source sentences with 1-3 translations each (240 pairs)."""
    return [(f"source {i}", f"target {i}.{k}") for i in range(120) for k in range(1 + i % 3)]


def test_split_is_disjoint_by_source_and_keeps_every_pair():
    pairs = grouped_pairs()
    splits = tatoeba.split_by_source(pairs, valid_size=20, test_size=25, seed=1)
    assert {name: len(split) for name, split in splits.items()} == {"train": len(pairs) - 45, "valid": 20, "test": 25}
    assert not sources(splits["train"]) & sources(splits["valid"])
    assert not sources(splits["train"]) & sources(splits["test"])
    assert not sources(splits["valid"]) & sources(splits["test"])
    assert Counter(pair for split in splits.values() for pair in split) == Counter(pairs)


def test_split_is_deterministic_for_a_seed():
    pairs = grouped_pairs()
    first = tatoeba.split_by_source(pairs, 20, 20, seed=7)
    assert tatoeba.split_by_source(list(pairs), 20, 20, seed=7) == first
    assert tatoeba.split_by_source(pairs, 20, 20, seed=8) != first


def test_split_max_pairs_caps_the_total():
    splits = tatoeba.split_by_source(grouped_pairs(), 10, 10, seed=0, max_pairs=100)
    assert (len(splits["valid"]), len(splits["test"])) == (10, 10)
    assert 95 <= sum(map(len, splits.values())) <= 100
    assert not sources(splits["train"]) & (sources(splits["valid"]) | sources(splits["test"]))


# ---------------------------------------------------------------- prepare_tatoeba end to end (fake export)

ENGLISH_FRENCH = [
    (f"{en} {adjective}.", f"{fr} {adjectif}.")
    for en, fr in [("I'm", "Je suis"), ("You are", "Vous êtes"), ("He's", "Il est"), ("We're", "Nous sommes")]
    for adjective, adjectif in [("tired", "fatigué"), ("happy", "content"), ("late", "en retard"), ("ready", "prêt"),
                                ("sick", "malade"), ("busy", "occupé"), ("here", "là"), ("cold", "froid")]
] + [("Hello.", "Bonjour."), ("Run!", "Cours\u202f!"), ("I'm tired.", "Je suis fatiguée."), ("I'm tired.", "Je suis fatigué.")]


def make_zip(path: Path, lines=ENGLISH_FRENCH, member="fra.txt") -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(member, "".join(f"{en}\t{fr}\n" for en, fr in lines))
        archive.writestr("_about.txt", "Date of this file:\n  2017-09-29\n")
    return path


def test_prepare_tatoeba_writes_a_readable_dataset(tmp_path, capsys):
    out = tmp_path / "tatoeba"
    argv = ["--zip", str(make_zip(tmp_path / "fra-eng.zip")), "--out", str(out), "--tutorial-filter", "--valid", "4", "--test", "3"]
    assert tatoeba.main(argv) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}: train 26, valid 4, test 3 pairs (fr->en, tutorial filter, seed 0)"
    assert resolve_languages(out) == ("fr", "en")
    splits = {name: read_parallel(out, name, "fr", "en") for name in ("train", "valid", "test")}
    assert {name: len(pairs) for name, pairs in splits.items()} == {"train": 26, "valid": 4, "test": 3}
    everything = [pair for pairs in splits.values() for pair in pairs]
    assert ("je suis fatigue .", "i m tired .") in everything  # the duplicate of this pair was dropped
    assert len(everything) == len(set(everything)) == 33
    assert all(en.startswith(tatoeba.ENG_PREFIXES) for _, en in everything)
    assert not sources(splits["train"]) & (sources(splits["valid"]) | sources(splits["test"]))
    info = read_dataset_info(out)
    assert info["license"].startswith("CC BY 2.0 FR") and "tatoeba.org" in info["attribution"]
    assert "manythings.org" in info["attribution"] and "2017-09-29" in info["source"]
    assert info["options"] == {
        "source": "fr", "target": "en", "tutorial_filter": True, "keep_text": False, "max_pairs": None, "valid": 4, "test": 3, "seed": 0,
        "max_length": 10, "eng_prefixes": list(tatoeba.ENG_PREFIXES),
    }
    assert info["counts"]["duplicates_dropped"] == 1

    assert tatoeba.main([*argv[:-1], "0"]) == 0  # --test 0: no test split, not an empty one
    assert read_dataset_info(out)["splits"] == {"train": 29, "valid": 4}
    with pytest.raises(UserError, match="has no split 'test'"):  # the first run's test files, not this dataset's
        read_parallel(out, "test", "fr", "en")


def test_prepare_tatoeba_direction_raw_text_and_determinism(tmp_path):
    zip_path = make_zip(tmp_path / "fra-eng.zip")
    for name in ("a", "b"):
        tatoeba.main(["--zip", str(zip_path), "--out", str(tmp_path / name), "--source", "en", "--target", "fr", "--valid", "3", "--test", "3", "--seed", "5"])
    assert resolve_languages(tmp_path / "a") == ("en", "fr")
    for file in ("train.en", "train.fr", "valid.en", "test.fr"):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes()
    pairs = [pair for split in ("train", "valid", "test") for pair in read_parallel(tmp_path / "a", split, "en", "fr")]
    assert ("Run!", "Cours\u202f!") in pairs  # raw text kept as it is
    assert ("Hello.", "Bonjour.") in pairs and len(pairs) == len(set(ENGLISH_FRENCH)) == len(ENGLISH_FRENCH) - 1
    # both translations of "I'm tired." share one split
    tired = {split for split in ("train", "valid", "test") for en, _ in read_parallel(tmp_path / "a", split, "en", "fr") if en == "I'm tired."}
    assert len(tired) == 1


def test_prepare_tatoeba_max_pairs_and_plain_text_input(tmp_path):
    text = tmp_path / "eng-fra.txt"
    text.write_text("".join(f"{en}\t{fr}\tCC-BY 2.0 (France) Attribution: tatoeba.org\n" for en, fr in ENGLISH_FRENCH), encoding="utf-8")
    tatoeba.main(["--zip", str(text), "--out", str(tmp_path / "out"), "--max-pairs", "20", "--valid", "2", "--test", "2"])
    counts = read_dataset_info(tmp_path / "out")["splits"]
    assert counts["valid"] == counts["test"] == 2 and counts["train"] <= 16
    assert all("\t" not in fr for _, fr in read_parallel(tmp_path / "out", "train", "fr", "en"))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--zip", "{tmp}/missing.zip"], "not found"),
        (["--zip", "{tmp}/empty.zip"], "holds no fra.txt"),
        (["--zip", "{tmp}/fra-eng.zip", "--source", "en", "--target", "en"], "both 'en'"),
        (["--zip", "{tmp}/fra-eng.zip", "--source", "de"], "not available"),
        (["--zip", "{tmp}/fra-eng.zip", "--valid", "20", "--test", "20"], "leave nothing for training"),
        (["--zip", "{tmp}/fra-eng.zip", "--max-pairs", "10", "--valid", "5", "--test", "5"], "leaves nothing"),
        (["--zip", "{tmp}/garbage.zip"], "not a valid zip"),
        (["--zip", "{tmp}/fra-eng.zip", "--keep-text"], "goes with --tutorial-filter"),
        (["--zip", "{tmp}/fra-eng.zip", "--valid", "0"], "--valid must be at least 1: training reads the valid split"),
        (["--zip", "{tmp}/unsupported.zip"], "cannot read .*unsupported.zip: .*compression"),  # had been a traceback
    ],
)
def test_prepare_tatoeba_bad_input(tmp_path, capsys, argv, message):
    make_zip(tmp_path / "fra-eng.zip")
    with zipfile.ZipFile(tmp_path / "empty.zip", "w") as archive:
        archive.writestr("other.txt", "x")
    with zipfile.ZipFile(tmp_path / "unsupported.zip", "w") as archive:
        archive.writestr("fra.txt", "Go.\tVa !\tCC-BY\n")
    raw = bytearray((tmp_path / "unsupported.zip").read_bytes())  # compression method 99 (AES), in both headers
    for header in (b"PK\x03\x04", b"PK\x01\x02"):
        at = raw.index(header) + (8 if header == b"PK\x03\x04" else 10)
        raw[at : at + 2] = (99).to_bytes(2, "little")
    (tmp_path / "unsupported.zip").write_bytes(bytes(raw))
    (tmp_path / "garbage.zip").write_bytes(b"not a zip")
    argv = [arg.format(tmp=tmp_path) for arg in argv] + ["--out", str(tmp_path / "out")]
    with pytest.raises(UserError, match=message):
        tatoeba.main(argv)
    capsys.readouterr()
    assert run_cli(tatoeba.main, argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert not (tmp_path / "out" / "dataset.json").exists()


# ---------------------------------------------------------------- prepare_multi30k (fake tree)

FAKE_MULTI30K = {
    "train": [("A dog runs.", "Ein Hund rennt.", "Un chien court."), ("Two men talk. ", " Zwei Männer reden.", "Deux hommes parlent.")],
    "val": [("A cat sleeps.", "Eine Katze schläft.", "Un chat dort.")],
    "test_2016_flickr": [("A girl sings.", "Ein Mädchen singt.", "Une fille chante."), ("Kids play.", "Kinder spielen.", "Des enfants jouent.")],
}


def make_multi30k(root: Path, drop: str = "", extra_line: str = "") -> Path:
    raw = root / "multi30k" / "task1" / "raw"
    raw.mkdir(parents=True)
    for stem, triples in FAKE_MULTI30K.items():
        for column, lang in enumerate(("en", "de", "fr")):
            name = f"{stem}.{lang}.gz"
            if name == drop:
                continue
            lines = [triple[column] for triple in triples] + ([extra_line] if name == "train.de.gz" and extra_line else [])
            with gzip.open(raw / name, "wt", encoding="utf-8") as handle:
                handle.write("".join(line + "\n" for line in lines))
    photos = root / "multi30k" / "task1" / "image_splits"
    photos.mkdir()
    for number, (stem, triples) in enumerate(FAKE_MULTI30K.items()):
        (photos / f"{stem}.txt").write_text("".join(f"{1000 * number + line}.jpg\n" for line in range(len(triples))))
    return root


def test_prepare_multi30k_leaves_out_the_listed_photos_from_train_and_valid_only(tmp_path, capsys):
    root = make_multi30k(tmp_path / "data")
    listed = tmp_path / "study.txt"  # Flickr8k names: the photo id before "_"
    listed.write_text("1_0a1b2c.jpg\n2000_77.jpg\n\n")
    out = tmp_path / "de-en"
    assert multi30k.main(["--source", "de", "--target", "en", "--data", str(root), "--out", str(out), "--exclude-photos", str(listed)]) == 0
    assert "left out 1 train pairs" in capsys.readouterr().out
    assert read_parallel(out, "train", "de", "en") == [("Ein Hund rennt.", "A dog runs.")]
    assert len(read_parallel(out, "valid", "de", "en")) == 1 and len(read_parallel(out, "test", "de", "en")) == 2  # test keeps 2000_77
    assert read_dataset_info(out)["excluded_photos"]["pairs_left_out"] == {"train": 1, "valid": 0}
    assert read_dataset_info(out)["excluded_photos"]["lists"] == [str(listed)]
    more = tmp_path / "more.txt"  # a second list: its photos go too (the last list alone was kept, silently)
    more.write_text("0_beef.jpg\n")  # the other training photo: each list alone leaves train a pair, both none
    with pytest.raises(UserError, match="the train split has no pair left"):
        multi30k.main(["--source", "de", "--target", "en", "--data", str(root), "--out", str(out), "--exclude-photos", str(listed), "--exclude-photos", str(more)])
    listed.write_text("1000_ffee.jpg\n")  # the only valid photo (as Multi30k's own val.txt would do to its valid split)
    with pytest.raises(UserError, match="the valid split has no pair left: --exclude-photos .* lists every photo of it"):
        multi30k.main(["--source", "de", "--target", "en", "--data", str(root), "--out", str(out), "--exclude-photos", str(listed)])
    assert read_dataset_info(out)["excluded_photos"]["pairs_left_out"] == {"train": 1, "valid": 0}  # the dataset there is kept
    listed.write_text("not-a-photo.png\n")
    with pytest.raises(UserError, match="not a Flickr image file name"):
        multi30k.main(["--source", "de", "--target", "en", "--data", str(root), "--out", str(tmp_path / "bad"), "--exclude-photos", str(listed)])


def test_prepare_multi30k_fake_tree(tmp_path, capsys):
    root = make_multi30k(tmp_path / "data")
    out = tmp_path / "de-en"
    assert multi30k.main(["--source", "de", "--target", "en", "--data", str(root), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}: train 2, valid 1, test 2 pairs (de->en)"
    assert resolve_languages(out) == ("de", "en")
    assert read_parallel(out, "train", "de", "en") == [("Ein Hund rennt.", "A dog runs."), ("Zwei Männer reden.", "Two men talk.")]
    assert read_parallel(out, "valid", "de", "en") == [("Eine Katze schläft.", "A cat sleeps.")]
    assert read_parallel(out, "test", "de", "en") == [("Ein Mädchen singt.", "A girl sings."), ("Kinder spielen.", "Kids play.")]
    info = read_dataset_info(out)
    assert info["splits"] == {"train": 2, "valid": 1, "test": 2} and "non-commercial" in info["license"]
    assert info["options"] == {"source": "de", "target": "en"} and "multi30k" in info["source"].lower()


def test_prepare_multi30k_any_pair_and_env_default(tmp_path, monkeypatch):
    root = make_multi30k(tmp_path / "data")
    monkeypatch.setenv("ATTNKIT_DATA", str(root))
    multi30k.main(["--source", "fr", "--target", "de", "--out", str(tmp_path / "fr-de")])
    assert read_parallel(tmp_path / "fr-de", "test", "fr", "de")[1] == ("Des enfants jouent.", "Kinder spielen.")


@pytest.mark.parametrize(
    "argv, tree, message",
    [
        (["--source", "de", "--target", "en", "--data", "{tmp}/nowhere"], {}, "data root not found"),
        (["--source", "de", "--target", "en", "--data", "{tmp}"], None, "no multi30k"),
        (["--source", "en", "--target", "en", "--data", "{tmp}/data"], {}, "both 'en'"),
        (["--source", "cs", "--target", "en", "--data", "{tmp}/data"], {}, "not a Multi30k task-1 language"),
        (["--source", "de", "--target", "en", "--data", "{tmp}/data"], {"drop": "val.en.gz"}, "not found"),
        (["--source", "de", "--target", "en", "--data", "{tmp}/data"], {"extra_line": "Noch ein Satz."}, "has 3 lines but"),
    ],
)
def test_prepare_multi30k_bad_input(tmp_path, capsys, argv, tree, message):
    if tree is not None:
        make_multi30k(tmp_path / "data", **tree)
    argv = [arg.format(tmp=tmp_path) for arg in argv] + ["--out", str(tmp_path / "out")]
    with pytest.raises(UserError, match=message):
        multi30k.main(argv)
    capsys.readouterr()
    assert run_cli(multi30k.main, argv) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert not (tmp_path / "out").exists()


def test_prepare_multi30k_missing_default_root(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNKIT_DATA", str(tmp_path / "absent"))
    assert run_cli(multi30k.main, ["--source", "de", "--target", "en", "--out", str(tmp_path / "out")]) == 2


def test_prepare_multi30k_real_data(tmp_path):
    needs_shared("multi30k", "task1", "raw")
    out = tmp_path / "de-en"
    multi30k.main(["--source", "de", "--target", "en", "--data", str(shared_data_root()), "--out", str(out)])
    assert read_dataset_info(out)["splits"] == {"train": 29000, "valid": 1014, "test": 1000}
    test = read_parallel(out, "test", "de", "en")
    assert test[0] == ("Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.", "A man in an orange hat starring at something.")
    assert all(de and en and de == de.strip() for de, en in test)


# ---------------------------------------------------------------- the embedded demo corpus


def test_embedded_corpus_is_small_attributed_and_split_by_source():
    info = read_dataset_info(EMBEDDED)
    assert resolve_languages(EMBEDDED) == ("fr", "en")
    assert info["license"].startswith("CC BY 2.0 FR")
    assert "tatoeba.org" in info["attribution"] and "manythings.org" in info["attribution"]
    assert info["options"]["tutorial_filter"] is True
    attribution = (EMBEDDED / "ATTRIBUTION.md").read_text(encoding="utf-8")
    assert "CC BY 2.0 FR" in attribution and "manythings.org/anki" in attribution and info["command"] in attribution
    assert sum(f.stat().st_size for f in EMBEDDED.iterdir()) < 1_000_000
    splits = {name: read_parallel(EMBEDDED, name, "fr", "en") for name in ("train", "valid", "test")}
    assert {name: len(pairs) for name, pairs in splits.items()} == info["splits"]
    assert info["splits"]["valid"] == info["splits"]["test"] == 500 and info["splits"]["train"] > 5000
    assert not sources(splits["train"]) & (sources(splits["valid"]) | sources(splits["test"]))
    assert not sources(splits["valid"]) & sources(splits["test"])
    english = [target for pairs in splits.values() for _, target in pairs]
    assert "I'm glad." in english and sum(any(c.isupper() for c in sentence) for sentence in english) > 0.9 * len(english)  # cased, apostrophes kept


@pytest.mark.slow
def test_embedded_corpus_is_reproducible_from_the_shared_export(tmp_path):
    zip_path = needs_shared("tatoeba-eng-fra", "fra-eng.zip")
    options = read_dataset_info(EMBEDDED)["options"]
    argv = ["--zip", str(zip_path), "--out", str(tmp_path / "again"), "--tutorial-filter", *(["--keep-text"] if options["keep_text"] else []),
            "--source", options["source"], "--target", options["target"],
            "--valid", str(options["valid"]), "--test", str(options["test"]), "--seed", str(options["seed"])]
    tatoeba.main(argv)
    for name in ("train", "valid", "test"):
        for lang in ("fr", "en"):
            assert (tmp_path / "again" / f"{name}.{lang}").read_bytes() == (EMBEDDED / f"{name}.{lang}").read_bytes()
    again = json.loads((tmp_path / "again" / "dataset.json").read_text(encoding="utf-8"))
    embedded = read_dataset_info(EMBEDDED)
    assert {k: v for k, v in again.items() if k != "command"} == {k: v for k, v in embedded.items() if k != "command"}


def test_an_unwritable_output_folder_is_one_message(tmp_path):
    from attnkit.data.text import write_parallel_dataset

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(UserError, match="cannot write the dataset folder"):
        write_parallel_dataset(blocker / "data", ("de", "en"), {"train": [("a", "b")]})
    assert blocker.read_text() == "not a folder"


@pytest.mark.parametrize(
    "content, message",
    [
        (b'{"task": "translation", "n": "caf\xe9"}', "is not UTF-8 text"),
        (b"[1, 2]", "must hold a JSON object (task, splits ...), not list"),
        (b'{"task": "translation"}', '"languages" must list the dataset\'s two languages'),
        (b'{"task": "translation", "languages": ["fr"]}', '"languages" must list the dataset\'s two languages'),
    ],
)
def test_a_hand_written_dataset_json_that_cannot_be_read_is_one_message(tmp_path, content, message):
    (tmp_path / "dataset.json").write_bytes(content)
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        resolve_languages(tmp_path)


def test_a_preparation_cut_short_keeps_the_old_dataset_whole(tmp_path, monkeypatch):
    """Each file was replaced whole, but one by one: a preparation cut short after its train.fr had taken the old
    dataset away (its dataset.json went first). The new files now wait under hidden names until all are written."""
    from attnkit.data.folder import DatasetWrite
    from attnkit.data.text import write_parallel_dataset

    folder = write_parallel_dataset(tmp_path / "d", ("fr", "en"), {"train": [("un", "one"), ("deux", "two")]})
    old_files = {path.name: path.read_bytes() for path in folder.iterdir()}
    written, write_text = [], DatasetWrite.write_text

    def cut_after_one(self, final, text):
        if written:
            raise KeyboardInterrupt
        written.append(final)
        write_text(self, final, text)

    monkeypatch.setattr(DatasetWrite, "write_text", cut_after_one)
    with pytest.raises(KeyboardInterrupt):
        write_parallel_dataset(folder, ("fr", "en"), {"train": [("trois", "three"), ("quatre", "four")]})
    assert written == [folder / "train.fr"]
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == old_files  # the new train.fr went with the rest
    assert read_parallel(folder, "train", "fr", "en") == [("un", "one"), ("deux", "two")]


def test_hidden_files_a_killed_preparation_left_go_with_the_next_one(tmp_path):
    """A SIGKILL leaves no time to remove the staged files: the next preparation of the folder removes them."""
    from attnkit.data.text import write_parallel_dataset
    from attnkit.files import temporary_name

    folder = write_parallel_dataset(tmp_path / "d", ("fr", "en"), {"train": [("un", "one")]})
    for name in ("train.fr", "dataset.json"):
        temporary_name(folder / name).write_text("from a killed run\n", encoding="utf-8")
    (folder / ".notes").write_text("the user's own\n", encoding="utf-8")
    write_parallel_dataset(folder, ("fr", "en"), {"train": [("deux", "two")]})
    assert sorted(path.name for path in folder.iterdir()) == [".notes", "dataset.json", "train.en", "train.fr"]


def test_a_finished_preparation_replaces_every_file_and_leaves_no_hidden_one(tmp_path):
    from attnkit.data.captions import CaptionedImage, read_caption_split, write_caption_dataset

    first = {"train": [CaptionedImage("a.jpg", ("a dog .",))]}
    folder = write_caption_dataset(tmp_path / "c", first, tmp_path)
    write_caption_dataset(folder, {"train": [CaptionedImage("b.jpg", ("a cat .", "a kitten ."))]}, tmp_path)
    assert sorted(path.name for path in folder.iterdir()) == ["dataset.json", "train.tsv"]
    assert [(item.image, item.captions) for item in read_caption_split(folder, "train")] == [("b.jpg", ("a cat .", "a kitten ."))]
    assert read_dataset_info(folder)["captions"] == {"train": 2}


def test_a_split_file_its_dataset_json_does_not_list_is_not_read(tmp_path):
    """Left from an earlier preparation of the folder (a test split, prepared again without one): not this dataset's."""
    from attnkit.data.captions import CaptionedImage, read_caption_split, write_caption_dataset

    splits = {name: [CaptionedImage(f"{name}.jpg", ("a photo .",))] for name in ("train", "valid", "test")}
    write_caption_dataset(tmp_path / "c", splits, tmp_path)
    write_caption_dataset(tmp_path / "c", {name: splits[name] for name in ("train", "valid")}, tmp_path)
    assert (tmp_path / "c" / "test.tsv").is_file() and read_caption_split(tmp_path / "c", "valid")
    with pytest.raises(UserError, match="has no split 'test': its dataset.json lists train, valid"):
        read_caption_split(tmp_path / "c", "test")
