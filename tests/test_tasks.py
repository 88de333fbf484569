"""The entry points in tasks/, end to end on a tiny model, and their answers to bad input."""

import json

import pytest
import torch

from attnkit.checkpoint import load_checkpoint, save_checkpoint
from attnkit.errors import run_cli
from attnkit.metrics import translation_scores
from attnkit.commands import demo, evaluate, train, translate

TINY = ["--config", "tasks/configs/tiny.yaml", "--no-progress", "--set", "train.epochs=1", "--set", "data.tokenizer.lowercase=false"]


@pytest.fixture(scope="module")
def checkpoint(toy_data, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    assert run_cli(train.main, [*TINY, "--set", f"data.path={toy_data}", "--set", f"output_dir={run_dir}"]) == 0
    assert {"best.pt", "last.pt", "config.yaml", "log.jsonl"} <= {p.name for p in run_dir.iterdir()}
    return run_dir / "best.pt"


@pytest.fixture(autouse=True)
def project_root(monkeypatch):
    from conftest import ROOT

    monkeypatch.chdir(ROOT)


def test_translate_sentences_and_write_attention(checkpoint, tmp_path, capsys):
    png = tmp_path / "attention.png"
    assert run_cli(translate.main, ["--checkpoint", str(checkpoint), "--attention-png", str(png), "a b c"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1
    assert png.stat().st_size > 1000


def test_translate_from_a_file_and_stdin_with_n_best(checkpoint, tmp_path, capsys, monkeypatch):
    (tmp_path / "in.txt").write_text("a b\nc d e\n")
    assert run_cli(translate.main, ["--checkpoint", str(checkpoint), "--input", str(tmp_path / "in.txt"), "--beam", "3"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("a b\n"))
    assert run_cli(translate.main, ["--checkpoint", str(checkpoint), "--beam", "3", "--n-best", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(line.startswith("1\t") for line in lines)


def test_translate_replace_unk_copies_the_source_word_the_attention_peaks_on(checkpoint, capsys, monkeypatch):
    """A stub search that emits <unk> looking at source position 1, then "A" looking at position 0."""
    import attnkit.translation
    from attnkit.search import Hypothesis
    from attnkit.vocab import Vocabulary

    target = Vocabulary(load_checkpoint(checkpoint).vocabularies["target"])
    attention = torch.tensor([[0.1, 0.8, 0.1], [0.7, 0.2, 0.1], [0.3, 0.3, 0.4]])  # (output steps incl. <eos>, source words)
    stub = Hypothesis([target.unk_index, target.index["A"]], -1.0, -2.0, attention, True)
    monkeypatch.setattr(attnkit.translation, "search", lambda decoder, encoded, *args, **options: [[stub] for _ in range(encoded.memory.size(0))])
    assert run_cli(translate.main, ["--checkpoint", str(checkpoint), "a Zork b"]) == 0
    assert capsys.readouterr().out.split() == ["<unk>", "A"]
    assert run_cli(translate.main, ["--checkpoint", str(checkpoint), "--replace-unk", "a Zork b"]) == 0
    assert capsys.readouterr().out.split() == ["Zork", "A"]  # the unknown source word, copied


def test_a_source_several_pairs_share_is_translated_once_and_scored_against_all_its_references(checkpoint, tmp_path):
    """Scored pair by pair, each copy of the output met one reference alone: a perfect system scored about 96 BLEU
    on the embedded Tatoeba test (469 French sentences, 500 translations)."""
    from attnkit.translation import Translator, references_by_source

    pairs = [("a b c", "x y z"), ("d e", "v w"), ("a b c", "x y q"), ("d e", "v w")]
    assert references_by_source(pairs) == (["a b c", "d e"], [["x y z", "x y q"], ["v w", "v w"]], [0, 1, 0, 1])
    translator = Translator.from_checkpoint(checkpoint, device="cpu")
    output = tmp_path / "hypotheses.txt"
    scores = translator.evaluate(pairs, beam_size=2, hypotheses_file=output)
    assert (scores["sentences"], scores["pairs"]) == (2, 4)
    lines = output.read_text().splitlines()  # one a pair, line for line with the split
    assert len(lines) == 4 and lines[0] == lines[2] and lines[1] == lines[3]
    references = [["a cat sat on the mat", "the cat sat on a mat"], ["two dogs run in the park"]]
    assert translation_scores(["the cat sat on a mat", "two dogs run in the park"], references)["bleu"] == 100.0


def test_evaluate_prints_bleu_and_chrf_json(checkpoint, toy_data, capsys, tmp_path):
    assert run_cli(evaluate.main, ["--checkpoint", str(checkpoint), "--split", "test", "--beam", "2"]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert {"bleu", "chrf", "bleu_signature", "sentences", "pairs"} <= set(scores) and scores["pairs"] == 60 and scores["sentences"] <= 60
    assert "case:mixed" in scores["bleu_cased_signature"] and "case:lc" in scores["bleu_lowercased_signature"]  # both variants, always
    source, reference = toy_data / "test.src", toy_data / "test.tgt"
    output = tmp_path / "hypotheses.txt"
    argv = ["--checkpoint", str(checkpoint), "--source", str(source), "--reference", str(reference), "--limit", "5", "--output", str(output)]
    assert run_cli(evaluate.main, argv) == 0
    assert json.loads(capsys.readouterr().out)["pairs"] == 5
    assert len(output.read_text().splitlines()) == 5


def test_bad_sentences_get_a_message_and_the_others_are_translated(checkpoint, capsys):
    code = run_cli(translate.main, ["--checkpoint", str(checkpoint), "a b", "", "zz yy", "a " * 80])
    captured = capsys.readouterr()
    assert code == 1
    assert captured.out.splitlines()[1:3] == ["", ""] and captured.out.splitlines()[0] and captured.out.splitlines()[3]
    assert "sentence 2: empty sentence" in captured.err
    assert "sentence 3: every word of the sentence is unknown" in captured.err
    assert "sentence 4 has more than 50 words" in captured.err
    assert "Traceback" not in captured.err


def test_evaluate_and_compare_warn_of_cut_sources_as_translate_does(checkpoint, tmp_path, capsys, monkeypatch):
    from types import SimpleNamespace

    from PIL import Image

    from attnkit.cli import warn_cut_sources
    from attnkit.translation import Translator
    from attnkit.commands import compare

    long = "a " * 60
    (tmp_path / "source.txt").write_text(f"a b\n{long}\n")
    (tmp_path / "reference.txt").write_text("B A\nA\n")
    argv = ["--checkpoint", str(checkpoint), "--source", str(tmp_path / "source.txt"), "--reference", str(tmp_path / "reference.txt")]
    assert run_cli(evaluate.main, argv) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["sentences"] == 2  # scored all the same
    assert captured.err.splitlines() == ["warning: sentence 2 has more than 50 words; only the first 50 were read"]

    # compare.py of one photo and sentence (the comparison itself stubbed: only what the translator reads matters here)
    translator = Translator.from_checkpoint(checkpoint, device="cpu")
    monkeypatch.setattr(compare.AttentionComparer, "from_checkpoints", lambda *args, **kwargs: SimpleNamespace(translator=translator, captioner=None))
    monkeypatch.setattr(compare, "write_comparison", lambda *args, **kwargs: [])
    Image.new("RGB", (8, 8)).save(tmp_path / "photo.png")
    argv = ["--checkpoint", str(checkpoint), "--image", str(tmp_path / "photo.png"), "--source", long, "--no-importance", "--out", str(tmp_path / "out")]
    assert run_cli(compare.main, argv) == 0
    assert capsys.readouterr().err.splitlines() == ["warning: source sentence 1 has more than 50 words; only the first 50 were read"]

    warn_cut_sources(list(range(1, 14)), translator)  # many: one line
    assert capsys.readouterr().err == "warning: sentences 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 and 3 more have more than 50 words; only the first 50 were read\n"


def test_bad_input_is_one_clear_message_and_a_nonzero_exit(checkpoint, tmp_path, capsys):
    other_task = tmp_path / "caption.pt"
    loaded = load_checkpoint(checkpoint)
    save_checkpoint(other_task, type(loaded)("captioning", loaded.config, loaded.vocabularies, loaded.model))
    unknown_task = tmp_path / "mystery.pt"
    save_checkpoint(unknown_task, type(loaded)("mystery", loaded.config, loaded.vocabularies, loaded.model))
    (tmp_path / "bad.yaml").write_text("train:\n  epochz: 3\n")
    cases = [
        (translate.main, ["--checkpoint", str(tmp_path / "missing.pt"), "a"], "checkpoint not found"),
        (translate.main, ["--checkpoint", str(other_task), "a"], "'captioning' checkpoint"),
        (evaluate.main, ["--checkpoint", str(unknown_task), "--split", "test"], "unknown task mystery"),
        (evaluate.main, ["--checkpoint", str(checkpoint), "--images", str(tmp_path), "--captions", "x"], "are for captioning checkpoints"),
        (train.main, ["--config", str(tmp_path / "bad.yaml")], "unknown config key train.epochz; valid keys in train: batch_size"),
        (train.main, [*TINY, "--set", f"data.path={tmp_path / 'nowhere'}"], "data folder not found"),
        (train.main, [], "give --config"),
        (evaluate.main, ["--checkpoint", str(checkpoint), "--split", "nosuchsplit"], "no split 'nosuchsplit'"),
        (translate.main, ["--checkpoint", str(checkpoint), "--input", str(tmp_path / "absent.txt")], "file not found"),
    ]
    for main, argv, message in cases:
        assert run_cli(main, argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err


def test_train_refuses_to_overwrite_and_resumes(checkpoint, capsys):
    run_dir = checkpoint.parent
    config = f"output_dir={run_dir}"
    before = (run_dir / "last.pt").read_bytes()
    assert run_cli(train.main, [*TINY, "--set", f"data.path={load_checkpoint(checkpoint).config['data']['path']}", "--set", config]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (run_dir / "last.pt").read_bytes() == before
    assert run_cli(train.main, ["--resume", str(run_dir / "last.pt"), "--no-progress", "--set", "train.epochs=2"]) == 0
    assert load_checkpoint(run_dir / "last.pt").training["progress"]["epoch"] == 2
    assert torch.load(run_dir / "best.pt", weights_only=True)["task"] == "translation"


def test_token_batches_too_small_for_a_target_are_one_message_and_leave_the_run_alone(checkpoint, capsys):
    run_dir = checkpoint.parent
    before = {path.name: path.read_bytes() for path in run_dir.iterdir() if path.is_file()}
    data = f"data.path={load_checkpoint(checkpoint).config['data']['path']}"
    argv = [*TINY, "--set", data, "--set", f"output_dir={run_dir}", "--set", "train.batch_tokens=4", "--overwrite"]
    assert run_cli(train.main, argv) == 2
    err = capsys.readouterr().err
    assert "train.batch_tokens: 4 is smaller than the longest training example" in err and "Traceback" not in err, err
    assert {path.name: path.read_bytes() for path in run_dir.iterdir() if path.is_file()} == before


@pytest.mark.slow
def test_demo_runs_on_the_embedded_corpus_and_lists_its_outputs(tmp_path, capsys):
    run_dir = tmp_path / "demo"
    argv = ["--config", "tasks/configs/tiny.yaml", "--no-progress", "--set", "train.epochs=1", "--set", f"output_dir={run_dir}"]
    argv += ["--scenes", "24", "--evaluate", "3", "--scenes-set", "train.epochs=1", "--scenes-set", f"data.feature_cache={tmp_path / 'cache'}"]
    argv += ["--scenes-set", "image_encoder.blocks=4", "--scenes-set", "image_encoder.memory_size=16", "--scenes-set", "text_encoder.embedding_size=16"]
    assert run_cli(demo.main, argv) == 0
    out = capsys.readouterr().out
    scenes = ["scenes/best.pt", "scenes/outputs.txt", "scenes/compare/metrics.json", "scenes/compare/distributions.png"]
    scenes += [f"scenes/compare/example/{name}" for name in ("comparison.png", "importance.png", "report.html", "statistics.json")]
    for name in ["best.pt", "log.jsonl", "translations.txt", "attention.png", "test_scores.json", *scenes]:
        assert (run_dir / name).stat().st_size > 0 and str(run_dir / name) in out
    metrics = json.loads((run_dir / "scenes/compare/metrics.json").read_text())
    assert metrics["test"]["scenes"] == 3 and "pointing_hit_rate" in metrics["compositional"]["grounding"]
    scores = json.loads((run_dir / "test_scores.json").read_text())
    assert (scores["pairs"], scores["sentences"]) == (500, 469)  # the embedded test split: 469 French sentences, 500 translations
    summary = json.loads((run_dir / "demo.json").read_text())  # written last: the demo is complete
    assert summary["held_out"]["test"]["scenes"] == 3 and summary["scene_model"]["epochs"] == 1 and str(run_dir / "demo.json") in out
    # Run again: the last demo is kept aside while the new one trains, and goes once the new one is complete.
    assert run_cli(demo.main, argv) == 0
    assert "the last demo is kept in" in capsys.readouterr().out and not (tmp_path / "demo.previous").exists()


def test_a_demo_cut_short_never_loses_the_last_complete_one(tmp_path, capsys):
    run_dir, kept = tmp_path / "demo", tmp_path / "demo.previous"
    assert demo.set_aside_previous(run_dir) is None  # nothing there yet
    run_dir.mkdir()
    (run_dir / "best.pt").write_text("the last demo's model")
    (run_dir / "demo.json").write_text("{}")
    assert demo.set_aside_previous(run_dir) == kept and not run_dir.exists()
    assert (kept / "best.pt").read_text() == "the last demo's model" and "kept in" in capsys.readouterr().out
    run_dir.mkdir()  # the new demo is cut short before its demo.json: the next run removes it, the kept one stays
    (run_dir / "best.pt").write_text("half-trained")
    assert demo.set_aside_previous(run_dir) == kept and not run_dir.exists()
    assert (kept / "best.pt").read_text() == "the last demo's model" and "cut short" in capsys.readouterr().out
    legacy = tmp_path / "older"  # a folder from before demo.json, with none kept: it is kept itself
    legacy.mkdir()
    (legacy / "best.pt").write_text("an older demo")
    assert demo.set_aside_previous(legacy) == tmp_path / "older.previous" and (tmp_path / "older.previous/best.pt").read_text() == "an older demo"


def test_the_tiny_transformer_recipe_trains_translates_and_evaluates(toy_data, tmp_path, capsys):
    run_dir = tmp_path / "run"
    overrides = ["train.epochs=1", f"data.path={toy_data}", f"output_dir={run_dir}", "data.tokenizer.lowercase=false"]
    argv = ["--config", "tasks/configs/tiny_transformer.yaml", "--no-progress", *(a for o in overrides for a in ("--set", o))]
    assert run_cli(train.main, argv) == 0
    capsys.readouterr()
    png = tmp_path / "attention.png"
    assert run_cli(translate.main, ["--checkpoint", str(run_dir / "best.pt"), "--beam", "3", "--attention-png", str(png), "a b c"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1 and png.stat().st_size > 1000
    assert run_cli(evaluate.main, ["--checkpoint", str(run_dir / "best.pt"), "--split", "test", "--beam", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["pairs"] == 60 and result["untranslatable"] == 0 and 0 <= result["bleu"] <= 100
