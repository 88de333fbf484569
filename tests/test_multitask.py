import json
from pathlib import Path

import pytest

from attnkit.checkpoint import load_checkpoint, save_checkpoint, with_overrides
from attnkit.config import load_config
from attnkit.data.batching import BatchLimit, BucketBatchSampler, TaskMixSampler, pad_sequences
from attnkit.data.folder import read_dataset_info
from attnkit.data.scenes import write_scene_dataset
from attnkit.errors import UserError
from attnkit.interfaces import Pixels
from attnkit.model import EncoderDecoder, build_captioning_model, build_multitask_model, build_translation_model
from attnkit.multitask import TaskMixDataset, train_multitask
from attnkit.vocab import Vocabulary


def tiny_joint_config(scenes: Path, run: Path, *more: str):
    return load_config(
        None,
        [
            "task=multitask",
            f"data.path={scenes}/captions",
            f"data.text_path={scenes}/text",
            "data.tokenizer.kind=space",
            "image_encoder.backbone=resnet18",
            "image_encoder.weights=none",
            "image_encoder.image_size=64",
            "image_encoder.grid_size=2",
            "image_encoder.memory_size=12",
            "image_encoder.position_embedding=true",
            "text_encoder.embedding_size=8",
            "text_encoder.hidden_size=6",
            "decoder.embedding_size=8",
            "decoder.hidden_size=12",
            "decoder.attention_size=8",
            "decoder.style=bahdanau",
            "decoder.score=additive",
            "train.batch_size=16",
            "train.epochs=2",
            "train.device=cpu",
            f"output_dir={run}",
            *more,
        ],
    )


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> Path:
    return write_scene_dataset(tmp_path_factory.mktemp("scenes"), {"train": 40, "valid": 6, "test": 6, "compositional": 6}, seed=0, size=64)


def test_task_mix_sampler_keeps_tasks_apart_and_follows_the_shares():
    captions, pairs = BucketBatchSampler([(5, 0)] * 40, 4, seed=0), BucketBatchSampler([(3, 3)] * 200, 4, seed=0)
    sampler = TaskMixSampler([captions, pairs], [0, 40], [0.8, 0.2], seed=1)
    batches = list(sampler)
    assert len(batches) == len(sampler) == 60
    kinds = ["caption" if max(b) < 40 else "text" for b in batches]
    assert all(max(b) < 40 or min(b) >= 40 for b in batches)  # one task per batch
    assert kinds.count("caption") > 2 * kinds.count("text")  # 80 % caption batches (a small task repeats)
    sampler.set_epoch(1)
    assert list(sampler) != batches
    with pytest.raises(ValueError):
        TaskMixSampler([captions, BucketBatchSampler([], 4)], [0, 40], [0.5, 0.5])


def test_a_task_given_no_batches_is_not_held_to_the_token_limit():
    """With train.caption_share 0 or 1 the other task's lengths were still checked against train.batch_tokens:
    a long pair refused a run that never draws it."""
    captions, long_pairs = [(5, 0)] * 12, [(3, 3)] * 11 + [(40, 30)]
    limit = BatchLimit(size=4, tokens=20)
    sampler = TaskMixSampler.bucketed([captions, long_pairs], [0, 12], [1.0, 0.0], limit, seed=0)
    batches = list(sampler)
    assert len(batches) == len(sampler) == 3 and all(max(b) < 12 for b in batches)  # captions alone, 4 of 5 tokens a batch
    with pytest.raises(UserError, match="batch_tokens: 20 is smaller than the longest training example .40 target tokens"):
        TaskMixSampler.bucketed([captions, long_pairs], [0, 12], [0.9, 0.1], limit, seed=0)


def test_task_mix_dataset_finds_each_task():
    mix = TaskMixDataset({"image": ["a", "b"], "text": ["c", "d", "e"]})
    assert len(mix) == 5 and mix[1] == ("image", "b") and mix[2] == ("text", "c") and mix[4] == ("text", "e")


def test_the_decoder_is_shared_and_sizes_must_agree(scenes, tmp_path):
    vocab = Vocabulary.build([["w"]])
    model = build_multitask_model(tiny_joint_config(scenes, tmp_path), vocab, vocab, load_weights=False)
    assert isinstance(model, EncoderDecoder) and set(model.encoders) == {"image", "text"}
    assert model.encoder_for("text").output_size == model.encoder_for("image").output_size
    with pytest.raises(UserError, match="one memory size"):
        build_multitask_model(tiny_joint_config(scenes, tmp_path, "image_encoder.memory_size=10"), vocab, vocab, load_weights=False)


def test_a_single_task_model_has_one_encoder_and_a_request_for_another_is_one_clear_message(scenes, tmp_path):
    vocab = Vocabulary.build([["w"]])
    config = tiny_joint_config(scenes, tmp_path)
    captioner, translator = build_captioning_model(config, vocab, load_weights=False), build_translation_model(config, vocab, vocab)
    assert set(captioner.encoders) == {"image"} and set(translator.encoders) == {"text"}
    with pytest.raises(UserError, match=r"^this model has no text encoder \(it has an image encoder only\)$"):
        captioner.encode(pad_sequences([[4, 5]]))
    with pytest.raises(UserError, match=r"^this model has no image encoder \(it has a text encoder only\)$"):
        translator.encoder_for("image")


def grounding_by_hand(checkpoint: str, split: str, scenes: int, reading: bool, seed: int = 0, size: int = 128) -> tuple[float, float]:
    """The pointing-game hit rate and the AER of ``compare --scenes``, recomputed from the forced attention
    with plain arithmetic (not attnkit.analysis): a referring word hits when its peak grid cell overlaps
    its object's box; AER = 1 - (|A & S| + |A & P|) / (|A| + |S|) over every scene's links. ``reading``:
    each word's attention at the step whose query has read it, else at the step that emits it."""
    from attnkit.comparison import AttentionComparer
    from attnkit.data.scenes import generate_scenes

    comparer = AttentionComparer.from_checkpoints(checkpoint)
    generated = generate_scenes(scenes, seed, split, size)
    sentences = [scene.sentences[0] for scene in generated]
    compared = comparer.compare([scene.image() for scene in generated], [s.french_text for s in sentences], [s.english_text for s in sentences])
    words = hits = 0
    hypothesis, sure, possible = set(), set(), set()
    for number, (scene, sentence, comparison) in enumerate(zip(generated, sentences, compared)):
        rows, columns = comparison.grid
        image_rows, text_rows = (comparison.image_reading, comparison.text_reading) if reading else (comparison.image_attention, comparison.text_attention)
        cell_width, cell_height = scene.size / columns, scene.size / rows
        for step, referent in enumerate(sentence.referents):
            if referent is None:
                continue
            row, column = divmod(int(image_rows[step].argmax()), columns)
            x0, y0, x1, y1 = scene.objects[referent].drawn_box
            words += 1
            hits += column * cell_width < x1 and (column + 1) * cell_width > x0 and row * cell_height < y1 and (row + 1) * cell_height > y0
        for step in range(len(sentence.english)):  # the <eos> row is no word
            hypothesis.add((number, int(text_rows[step].argmax()), step))
        sure |= {(number, f, e) for f, e in sentence.sure}
        possible |= {(number, f, e) for f, e in (*sentence.sure, *sentence.possible)}
    return hits / words, 1 - (len(hypothesis & sure) + len(hypothesis & possible)) / (len(hypothesis) + len(sure))


@pytest.mark.slow
def test_joint_training_then_caption_translate_evaluate_and_compare(scenes, tmp_path, capsys, monkeypatch):
    from attnkit import model as model_module
    from attnkit.commands import caption, compare, evaluate, translate

    run = tmp_path / "run"
    progress = train_multitask(tiny_joint_config(scenes, run), progress_bar=False, log=lambda *a: None)
    assert progress.epoch == 2
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert {"caption_bleu4", "bleu", "score"} <= set(log[-1]["valid"])
    checkpoint = str(run / "best.pt")

    image = scenes / "images" / "test-00000.png"
    assert caption.main(["--checkpoint", checkpoint, str(image)]) == 0  # the image picks the image encoder
    assert translate.main(["--checkpoint", checkpoint, "un grand cercle rouge"]) == 0  # a sentence picks the text encoder
    capsys.readouterr()
    assert evaluate.main(["--checkpoint", checkpoint, "--split", "test", "--task", "translate"]) == 0
    assert "bleu" in json.loads(capsys.readouterr().out)
    with pytest.raises(UserError, match="--task caption or --task translate"):
        evaluate.main(["--checkpoint", checkpoint, "--split", "test"])

    out = tmp_path / "compare"
    built = []
    monkeypatch.setattr(model_module, "build_multitask_model", lambda *args, **kwargs: built.append(args) or build_multitask_model(*args, **kwargs))
    assert compare.main(["--checkpoint", checkpoint, "--image", str(image), "--source", "un grand cercle rouge", "--target", "a large red circle", "--out", str(out)]) == 0
    assert len(built) == 1, "the joint checkpoint's model is built once for both of its faces"
    statistics = json.loads((out / "statistics.json").read_text())
    assert len(statistics["per_word"]) == len(statistics["target"].split()) + 1  # every word and <eos>
    assert all("reading" in word for word in statistics["per_word"][:-1]) and set(statistics["reading"]) == {"image", "text"}
    assert all(set(word["erasure"]) == {"image", "text"} for word in statistics["per_word"]) and statistics["erasure"]["text"]["steps"] >= 1
    words = statistics["per_word"][:-1]  # the erasure means are the words', as the agreement's: <eos> is no word
    assert statistics["erasure"]["text"]["steps"] == len(words)
    assert statistics["erasure"]["text"]["peak_drop"] == pytest.approx(sum(w["erasure"]["text"]["peak_drop"] for w in words) / len(words), abs=1e-3)
    assert (out / "comparison.png").stat().st_size > 0 and "<script" in (out / "report.html").read_text()
    assert (out / "importance.png").stat().st_size > 0 and 'id="view"' in (out / "report.html").read_text()
    assert set(statistics["agreement"]["image"]) == {"attention", "input", "windows"} and "importance" in statistics["per_word"][0]
    assert statistics["unknown_words"] == {"captioner": [], "translator": []}
    capsys.readouterr()
    partly = ["--checkpoint", checkpoint, "--image", str(image), "--source", "un grand cercle rouge", "--target", "a large zebra circle", "--out", str(tmp_path / "partly")]
    assert compare.main(partly) == 0  # forced as <unk>, and said
    assert "warning: the captioner does not know 1 target word(s) (zebra); each is forced as <unk>" in capsys.readouterr().err
    assert json.loads((tmp_path / "partly" / "statistics.json").read_text())["unknown_words"] == {"captioner": ["zebra"], "translator": ["zebra"]}
    unknown = ["--checkpoint", checkpoint, "--image", str(image), "--source", "un grand cercle rouge", "--target", "zebra giraffe", "--out", str(tmp_path / "unknown")]
    with pytest.raises(UserError, match="every word of the target sentence 'zebra giraffe' is unknown to the captioner"):
        compare.main(unknown)

    scenes_out = tmp_path / "compare-scenes"
    assert compare.main(["--checkpoint", checkpoint, "--scenes", "4", "--out", str(scenes_out)]) == 0
    metrics = json.loads((scenes_out / "metrics.json").read_text())
    for split in ("test", "compositional"):
        assert metrics[split]["grounding"] == metrics[split]["grounding_by_extraction"][metrics[split]["extraction"]]
        for extraction, grounding in metrics[split]["grounding_by_extraction"].items():
            hit_rate, aer = grounding_by_hand(checkpoint, split, scenes=4, reading=extraction == "reading")
            assert grounding["pointing_hit_rate"] == round(100 * hit_rate, 2)
            assert grounding["aer"] == round(aer, 4)
            assert set(grounding["pointing_hit_rate_by_word_kind"]) <= {"size", "colour", "shape"}
            assert sum(grounding["words_by_word_kind"].values()) == grounding["text_words"]
        declared = metrics[split]["grounding"]  # a single-head decoder's one head is its declared attention
        pointing, aer = declared["pointing_hit_rate"], declared["aer"]
        assert metrics[split]["grounding_by_head"] == {
            "image_pointing_hit_rate": [[pointing]], "text_aer": [[aer]], "image_pointing_hit_rate_layer_mean": [pointing], "text_aer_layer_mean": [aer]
        }  # fmt: skip
    assert (scenes_out / "distributions.png").is_file() and (scenes_out / "example" / "report.html").is_file()
    assert (scenes_out / "erasure.png").stat().st_size > 0
    for form in ("attention", "input"):  # importance maps scored as attention is, and their agreement with it
        grounding = metrics["test"]["importance_grounding"][form]
        assert 0 <= grounding["pointing_hit_rate"] <= 100 and 0 <= grounding["aer"] <= 1
        assert grounding["image_referring_words"] == metrics["test"]["grounding"]["image_referring_words"]
        assert -1 <= metrics["test"]["agreement"]["text"][form]["rank_correlation"] <= 1
    for modality in ("image", "text"):
        erasure = metrics["test"]["erasure"][modality]
        assert erasure["steps"] == sum(kind["steps"] for kind in erasure["by_word_kind"].values())  # every word, once
        assert {"peak_drop", "random_drop", "lowest_drop", "peak_flip", "flip_share", "never_flips"} <= set(erasure)


def test_compare_refuses_mixed_or_missing_checkpoints(scenes, tmp_path):
    from attnkit.commands import compare

    with pytest.raises(UserError, match="joint checkpoint, or both"):
        compare.main(["--caption-checkpoint", str(tmp_path / "x.pt"), "--image", "a.png", "--source", "b", "--out", str(tmp_path)])
    with pytest.raises(UserError, match="a mosaic comparison has no importance maps"):
        compare.main(["--checkpoint", str(tmp_path / "x.pt"), *["--image", "a.png", "--source", "b"] * 4, "--no-importance", "--out", str(tmp_path)])


@pytest.mark.parametrize(
    "options, message",
    [
        (["--importance", "windows,lime"], "unknown importance estimator 'lime'"),
        (["--mask-share", "1.5"], "strictly between 0 and 1"),
        (["--masks", "0"], "random masks must be 1 or more"),
        (["--windows", "1,x"], "whole numbers separated by commas"),
    ],
)
def test_compare_refuses_bad_importance_settings_before_loading_anything(tmp_path, options, message):
    from attnkit.commands import compare

    with pytest.raises(UserError, match=message):  # the checkpoint does not exist: the settings are refused first
        compare.main(["--checkpoint", str(tmp_path / "x.pt"), "--scenes", "2", *options, "--out", str(tmp_path / "out")])


def test_compare_refuses_windows_larger_than_the_grid(joint_comparer, tmp_path):
    from attnkit.commands import compare

    _, checkpoint = joint_comparer
    with pytest.raises(UserError, match="a window of 3 x 3 cells does not fit the 2 x 2 grid"):
        compare.main(["--checkpoint", str(checkpoint), "--scenes", "2", "--importance", "windows", "--windows", "1,3", "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_position_embedding_needs_a_fixed_grid(scenes, tmp_path):
    vocab = Vocabulary.build([["w"]])
    with pytest.raises(UserError, match="grid_size"):
        build_multitask_model(tiny_joint_config(scenes, tmp_path, "image_encoder.grid_size=0"), vocab, vocab, load_weights=False)


@pytest.mark.slow
def test_a_joint_transformer_reports_every_heads_grounding_and_its_declared_head_is_the_one_scored(scenes, tmp_path):
    from attnkit.commands import compare

    run = tmp_path / "run"
    transformer = ["decoder.family=transformer", "decoder.style=luong", "decoder.score=scaled_dot", "decoder.embedding_size=12", "decoder.heads=2"]
    declared = ["decoder.num_layers=2", "decoder.feedforward_size=16", "decoder.attention_layer=0", "decoder.attention_head=1"]
    train_multitask(tiny_joint_config(scenes, run, "train.epochs=1", *transformer, *declared), progress_bar=False, log=lambda *a: None)
    out = tmp_path / "compare-scenes"
    assert compare.main(["--checkpoint", str(run / "best.pt"), "--scenes", "4", "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())["test"]
    table = metrics["grounding_by_head"]
    assert [len(row) for row in table["image_pointing_hit_rate"]] == [2, 2] and [len(row) for row in table["text_aer"]] == [2, 2]
    assert metrics["grounding"]["pointing_hit_rate"] == table["image_pointing_hit_rate"][0][1]  # layer 0, head 1: the declared one
    assert metrics["grounding"]["aer"] == table["text_aer"][0][1]
    assert (out / "heads.png").stat().st_size > 0  # the layer x head figure
    assert 'id="image-head"' in (out / "example" / "report.html").read_text()  # and the report's head switch

    # Declaring another head afterwards (as bench/scenes.py does once it has chosen on validation): the mean of layer 1's heads.
    declared = save_checkpoint(tmp_path / "declared.pt", with_overrides(load_checkpoint(run / "best.pt"), ["decoder.attention_layer=1", "decoder.attention_head=-1"]))
    again = tmp_path / "again"
    assert compare.main(["--checkpoint", str(declared), "--scenes", "4", "--out", str(again)]) == 0
    second = json.loads((again / "metrics.json").read_text())["test"]
    assert second["grounding"]["pointing_hit_rate"] == second["grounding_by_head"]["image_pointing_hit_rate_layer_mean"][1]
    assert second["grounding_by_head"] == table  # the heads themselves are the same model's
    with pytest.raises(UserError, match="decoder.attention_head"):
        with_overrides(load_checkpoint(run / "best.pt"), ["decoder.attention_head=2"])


def test_the_declared_attention_is_the_best_on_validation_by_pointing_plus_100_times_one_minus_aer():
    from attnkit.comparison import choose_declared_attention

    heads = {
        "image_pointing_hit_rate": [[50.0, 80.0], [60.0, 70.0]],
        "text_aer": [[0.5, 0.4], [0.1, 0.6]],  # scores: 100, 140 | 150, 110
        "image_pointing_hit_rate_layer_mean": [65.0, 70.0],
        "text_aer_layer_mean": [0.2, 0.2],  # 145 | 150: ties layer 2's head 1, and the mean goes first
    }
    assert choose_declared_attention(heads) == (1, -1)
    heads["text_aer"][0][1] = 0.0  # layer 1, head 2: 180
    assert choose_declared_attention(heads) == (0, 1)
    with pytest.raises(ValueError, match="different heads"):
        choose_declared_attention({**heads, "text_aer": [[0.1]]})


@pytest.fixture(scope="module")
def joint_comparer(scenes, tmp_path_factory):
    """A tiny joint model on scenes, with a 2 x 2 grid: each quadrant of a mosaic is exactly one cell."""
    from attnkit.comparison import AttentionComparer

    run = tmp_path_factory.mktemp("joint")
    train_multitask(tiny_joint_config(scenes, run, "train.epochs=1"), progress_bar=False, log=lambda *a: None)
    return AttentionComparer.from_checkpoints(run / "best.pt", device="cpu"), run / "best.pt"


def scene_inputs(scenes: Path, count: int):
    from attnkit.comparison import StudyInput

    truth = [json.loads(line) for line in (scenes / "test.jsonl").read_text().splitlines()][:count]
    return [StudyInput(scenes / "images" / scene["image"], " ".join(scene["sentences"][0]["french"]), " ".join(scene["sentences"][0]["english"])) for scene in truth]


def test_importance_maps_of_both_modalities_come_with_their_agreement(scenes, joint_comparer):
    import torch

    from attnkit.data.images import grey_cells, load_image
    from attnkit.importance import ESTIMATORS, ImportanceSettings

    comparer, _ = joint_comparer
    inputs = scene_inputs(scenes, 2)
    every = ImportanceSettings(ESTIMATORS, window_sizes=(1, 2), masks=8, gradient_steps=4)
    compared = comparer.compare([i.image for i in inputs], [i.source for i in inputs], [i.target for i in inputs], importance=every)
    for comparison in compared:
        steps = len(comparison.target_words)
        assert comparison.estimators() == ESTIMATORS
        for modality, by_form in comparison.importance().items():
            positions = (comparison.image_attention if modality == "image" else comparison.text_attention).shape[1]
            assert all(by_form[form].shape == (steps, positions) for form in ESTIMATORS)
            assert not any(by_form[form].isnan().any() for form in ESTIMATORS if form != "attention")
        statistics = comparison.statistics()
        assert set(statistics["agreement"]) == {"image", "text"}
        assert all(-1 <= statistics["agreement"][m][form]["rank_correlation"] <= 1 for m in ("image", "text") for form in ESTIMATORS)
        first = statistics["per_word"][0]["importance"]
        assert len(first["text"]["input"]) == len(comparison.source_words) and "agreement" in first["image"]
    # The hidden cells are greyed in pixels and the copy re-encoded through the backbone: hiding cell 1 is that image's encoding.
    captioner = comparer.captioner
    encoder = captioner.model.encoder_for("image")
    grid = compared[0].grid
    keep = torch.ones(1, *grid, dtype=torch.bool)
    keep[0, 0, 1] = False
    pixels = load_image(inputs[0].image, encoder.config.image_size, encoder.normalization)
    expected = captioner.model.encode(Pixels(grey_cells(pixels, keep)))
    torch.testing.assert_close(captioner.hideable(inputs[0].image, grid).encode_keeping(keep).memory, expected.memory, atol=1e-5, rtol=1e-4)
    # A source word hidden is <unk> there: nothing hidden is the plain source.
    words = compared[0].source_words
    text = comparer.translator.hideable(words)
    assert text.shape == (len(words),)
    torch.testing.assert_close(text.encode_keeping(torch.ones(1, len(words), dtype=torch.bool)).memory, comparer.translator.encode_words([words]).memory)
    unknown = ["<unk>", *words[1:]]
    hidden_first = torch.ones(1, len(words), dtype=torch.bool)
    hidden_first[0, 0] = False
    torch.testing.assert_close(text.encode_keeping(hidden_first).memory, comparer.translator.encode_words([unknown]).memory)


def test_scene_evaluation_shows_its_progress_scene_by_scene_unless_told_not_to(joint_comparer, capsys):
    from attnkit.comparison import evaluate_scenes
    from attnkit.data.scenes import generate_scenes

    comparer, _ = joint_comparer
    scenes = generate_scenes(3, 0, "test", 64)
    done = []
    comparer.compare([s.image() for s in scenes], [s.sentences[0].french_text for s in scenes], [s.sentences[0].english_text for s in scenes], each=lambda: done.append(1))
    assert len(done) == 3  # once per example, as each is done
    capsys.readouterr()
    shown = evaluate_scenes(comparer, scenes, batch_size=2, importance=False, progress=True)
    assert "scenes compared" in capsys.readouterr().err  # the bar, on standard error
    hidden = evaluate_scenes(comparer, scenes, batch_size=2, importance=False, progress=False)
    assert "scenes compared" not in capsys.readouterr().err
    assert hidden["grounding"] == shown["grounding"]  # the bar changes nothing measured


def test_compare_scenes_without_importance_maps_scores_the_attention_alone(joint_comparer, tmp_path):
    from attnkit.commands import compare

    _, checkpoint = joint_comparer
    out = tmp_path / "scenes"
    assert compare.main(["--checkpoint", str(checkpoint), "--scenes", "2", "--no-importance", "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert all("grounding" in metrics[split] and "importance_grounding" not in metrics[split] for split in ("test", "compositional"))
    assert (out / "example" / "importance.png").is_file()  # the example scene's comparison keeps its maps


def test_compare_scenes_scores_the_estimators_it_is_given(joint_comparer, tmp_path):
    from attnkit.commands import compare

    _, checkpoint = joint_comparer
    out = tmp_path / "scenes"
    options = ["--importance", "windows,norm_weighted", "--windows", "1,2", "--hide-at", "memory", "--no-progress"]
    assert compare.main(["--checkpoint", str(checkpoint), "--scenes", "2", *options, "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    for split in ("test", "compositional"):
        assert list(metrics[split]["importance_grounding"]) == ["windows", "norm_weighted"]
        assert list(metrics[split]["agreement"]["image"]) == ["windows", "norm_weighted"]
        found = metrics[split]["importance_grounding"]["windows"]
        assert 0 <= found["aer_content_words"] <= 1 and found["content_words"] <= found["text_words"]
        heads = metrics[split]["norm_weighted_by_head"]  # the tiny decoder's one attention: its view is the declared one
        assert heads["image_pointing_hit_rate_layer_mean"] == [metrics[split]["importance_grounding"]["norm_weighted"]["pointing_hit_rate"]]
        assert heads["text_aer_layer_mean"] == [metrics[split]["importance_grounding"]["norm_weighted"]["aer"]]
    statistics = json.loads((out / "example" / "statistics.json").read_text())
    assert set(statistics["per_word"][0]["importance"]["image"]) == {"windows", "norm_weighted", "agreement"}


def test_compare_scenes_no_progress_turns_the_bar_off(joint_comparer, tmp_path, monkeypatch):
    from attnkit import report
    from attnkit.commands import compare

    class Asked(Exception):
        """Raised at the first split's evaluation: what was asked is all this test reads, the scoring is another's."""

    _, checkpoint = joint_comparer
    asked = []

    def evaluate_scenes(*args, **kwargs):
        asked.append(kwargs["progress"])
        raise Asked

    monkeypatch.setattr(report, "evaluate_scenes", evaluate_scenes)
    for quiet in (["--no-progress"], []):
        with pytest.raises(Asked):
            compare.main(["--checkpoint", str(checkpoint), "--scenes", "2", "--no-importance", *quiet, "--out", str(tmp_path / "out")])
    assert asked == [False, None]  # None: the bar shows where standard error is a terminal


def test_compare_on_a_one_word_source_writes_strict_json_with_null_where_nothing_was_measured(scenes, joint_comparer, tmp_path):
    from attnkit.commands import compare

    _, checkpoint = joint_comparer
    out = tmp_path / "one-word"
    image = scenes / "images" / "test-00000.png"
    assert compare.main(["--checkpoint", str(checkpoint), "--image", str(image), "--source", "cercle", "--target", "a red circle", "--out", str(out)]) == 0
    text = (out / "statistics.json").read_text(encoding="utf-8")
    statistics = json.loads(text, parse_constant=lambda constant: pytest.fail(f"bare {constant} in statistics.json: jq and JSON.parse refuse it"))
    erased = statistics["erasure"]["text"]  # one source word: nothing to remove against another, nothing to flip
    assert erased["flip_share"] is None and erased["peak_drop"] is None and erased["random_drop"] is None
    # Hidden from the attention, the one word leaves nothing to attend to: nothing measured (it was a traceback)
    hidden = tmp_path / "one-word-hidden"
    argv = ["--checkpoint", str(checkpoint), "--image", str(image), "--source", "cercle", "--target", "a red circle", "--out", str(hidden)]
    assert compare.main([*argv, "--hide-at", "attention", "--importance", "input,windows"]) == 0
    json.loads((hidden / "statistics.json").read_text(encoding="utf-8"), parse_constant=lambda constant: pytest.fail(f"bare {constant}"))


def test_a_mosaic_comparison_keeps_each_inputs_positions_and_scores_its_own(scenes, joint_comparer):
    import torch

    from attnkit.analysis import localisation

    comparer, _ = joint_comparer
    inputs = scene_inputs(scenes, 4)
    sources = [item.source for item in inputs]
    words, lengths = comparer.join_sources(sources)
    tokenizer = comparer.translator.pipeline.source_tokenizer
    assert lengths == [len(tokenizer.tokenize(sentence)) for sentence in sources]
    assert words == [word for sentence in sources for word in tokenizer.tokenize(sentence)]  # each sentence whole, in order

    found = comparer.compare_mosaic([item.image for item in inputs], sources, inputs[2].target, own=2, heads=True)
    comparison = found.comparison
    assert found.image.size == (64, 64) and comparison.grid == (2, 2) and comparison.source_words == words
    assert comparison.text_attention.shape[1] == sum(lengths)  # every joined position is real (none masked)
    assert torch.allclose(comparison.text_attention.sum(-1), torch.ones(len(comparison.target_words)), atol=1e-5)
    image_region, text_region = found.regions()
    assert image_region.tolist() == [0.0, 0.0, 1.0, 0.0]  # quadrant 2 (bottom left) is cell 2 of the 2 x 2 grid
    start = sum(lengths[:2])
    assert text_region.nonzero().flatten().tolist() == list(range(start, start + lengths[2]))
    by_word = found.localisation()
    image_rows, text_rows = comparison.word_attention("emitting")
    assert torch.allclose(by_word["image"][0], image_rows[:, 2]) and torch.allclose(by_word["text"][0], text_rows[:, start : start + lengths[2]].sum(-1))
    assert torch.equal(by_word["image"][1], image_rows.argmax(-1) == 2)
    heads = found.head_localisation()  # the RNN's one attention is its one "head"
    assert heads["image"][0].shape == (len(comparison.target_words) - 1, 1, 1)
    assert torch.allclose(heads["image"][0][:, 0, 0], localisation(image_rows, image_region)[0])


def test_the_mosaic_study_is_seeded_records_its_arrangements_and_refuses_too_few_inputs(scenes, joint_comparer):
    from attnkit.comparison import mosaic_study
    from attnkit.data.images import mosaic_arrangements

    comparer, _ = joint_comparer
    arrangements = mosaic_arrangements(6, seed=3)
    assert arrangements == mosaic_arrangements(6, seed=3) and arrangements != mosaic_arrangements(6, seed=4)
    assert all(i in order and len(set(order)) == 4 for i, order in enumerate(arrangements))
    assert len({order.index(i) for i, order in enumerate(arrangements)}) > 1  # the own photo's quadrant varies
    result = mosaic_study(comparer, scene_inputs(scenes, 6), seed=3, heads=True)
    assert result["mosaics"] == 6 and result["arrangements"] == arrangements and not result["skipped"]
    for modality in ("image", "text"):
        found = result[modality]
        assert 0.0 <= found["mass"] <= 1.0 and 0.0 <= found["pointing"] <= 1.0
        assert set(found["by_group"]) <= {"content", "function", "punctuation"} and found["chance"] == pytest.approx(0.25, abs=0.1)
        assert [len(row) for row in found["content_by_head"]["mass"]] == [1]
    with pytest.raises(UserError, match="at least 4 inputs"):
        mosaic_study(comparer, scene_inputs(scenes, 3))


def test_compare_writes_a_mosaic_comparison_and_refuses_bad_mosaics(scenes, joint_comparer, tmp_path, monkeypatch):
    from attnkit.commands import compare

    comparer, checkpoint = joint_comparer
    inputs = scene_inputs(scenes, 4)
    argv = ["--checkpoint", str(checkpoint), "--own", "1", *(f"--image={item.image}" for item in inputs), *(f"--source={item.source}" for item in inputs)]
    out = tmp_path / "mosaic"
    assert compare.main([*argv, "--target", inputs[1].target, "--out", str(out)]) == 0
    statistics = json.loads((out / "statistics.json").read_text())
    localised = statistics["localisation"]
    assert localised["own"] == 1 and sum(localised["source_lengths"]) == len(statistics["source_words"])
    assert [word["word"] for word in localised["per_word"]] == statistics["target"].split()
    assert (out / "comparison.png").stat().st_size > 0 and "<script" in (out / "report.html").read_text()

    with pytest.raises(UserError, match="--own picks the described input of a mosaic"):
        compare.main([*argv[:5], argv[8], "--out", str(tmp_path / "one")])  # one photo and one sentence, with --own 1
    with pytest.raises(UserError, match="one --image and one --source, or 4 of each"):
        compare.main([*argv[:-1], "--out", str(tmp_path / "three")])
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not an image")
    with pytest.raises(UserError, match="broken.jpg"):
        compare.main([*argv[:4], f"--image={broken}", *argv[5:], "--out", str(tmp_path / "unreadable")])  # the first photo unreadable
    monkeypatch.setattr(comparer.translator.model.encoder_for("text"), "max_length", 5)  # as learned positions would limit it
    with pytest.raises(UserError, match=r"longer than the 5 its text encoder reads"):
        comparer.compare_mosaic([item.image for item in inputs], [item.source for item in inputs], None, own=0)


def test_the_mosaic_chance_is_what_even_attention_scores_word_for_word():
    """Attention spread evenly puts on a word's own input its region's share; the chance beside the mass is that,
    weighted as the mass is, per word (a sentence of three grouped words counts three times)."""
    import torch

    from attnkit.comparison import LocalisationTally

    tally = LocalisationTally()
    for region, groups in ((torch.tensor([1.0, 1.0, 0.0, 0.0]), ["content", "function", "content"]), (torch.tensor([1.0] + [0.0] * 9), ["content", None])):
        even = torch.full((len(groups),), float(region.mean()))  # each word's mass on its own input under even attention
        tally.add(groups, even, even > 0.5, region)
    summary = tally.summary()
    assert summary["chance"] == pytest.approx((0.5 * 3 + 0.1 * 1) / 4) == summary["mass"]


def test_a_joint_run_whose_text_pairs_are_all_too_long_is_one_message(scenes, tmp_path):
    """Every pair over data.max_source_length left the translation task no batches: TaskMixSampler's ValueError
    came out as a traceback (a translation-only run says 'no usable training examples')."""
    config = tiny_joint_config(scenes, tmp_path / "run", "data.max_source_length=2")
    with pytest.raises(UserError, match=r"text: no usable translation training examples .* gives the translations 50% of the batches"):
        train_multitask(config, progress_bar=False, log=lambda *a: None)


def test_scenes_written_again_and_cut_short_leave_the_old_scenes_whole(tmp_path, monkeypatch):
    """Only the root dataset.json was removed first: a regeneration cut short left captions/ and text/ readable,
    pairing the new seed's images with the old seed's captions. Then all three went first, and the old scenes
    were lost; now every new file, images included, waits under a hidden name until the last is written."""
    from attnkit.data.folder import DatasetWrite

    folder = write_scene_dataset(tmp_path / "scenes", {"train": 4, "valid": 2}, seed=0, size=32)
    old_files = {path.relative_to(folder): path.read_bytes() for path in folder.rglob("*") if path.is_file()}
    assert folder / "captions" / "dataset.json" in {folder / path for path in old_files}

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(DatasetWrite, "write_text", interrupted)  # cut short after the first split's images
    with pytest.raises(KeyboardInterrupt):
        write_scene_dataset(folder, {"train": 4, "valid": 2}, seed=1, size=32)
    assert {path.relative_to(folder): path.read_bytes() for path in folder.rglob("*") if path.is_file()} == old_files
    monkeypatch.undo()
    write_scene_dataset(folder, {"train": 4, "valid": 2}, seed=1, size=32)
    new_files = {path.relative_to(folder): path.read_bytes() for path in folder.rglob("*") if path.is_file()}
    assert new_files.keys() == old_files.keys() and new_files[Path("images/train-00000.png")] != old_files[Path("images/train-00000.png")]
    assert read_dataset_info(folder / "captions")["seed"] == 1


def test_scene_scoring_refuses_a_model_that_splits_the_scenes_words_otherwise(joint_comparer, monkeypatch):
    """Gold links index the scenes' space-split words: a model on Moses tokens (d' split from the next word) was
    scored against shifted positions, AER 0.43 for a perfect aligner, and said nothing."""
    from attnkit.comparison import evaluate_scenes
    from attnkit.data.scenes import generate_scenes

    comparer, _ = joint_comparer
    tokenizer = comparer.translator.pipeline.source_tokenizer
    monkeypatch.setattr(tokenizer, "tokenize", lambda text: text.replace("'", " '").split())  # as Moses splits d'
    scenes = [scene for scene in generate_scenes(40, 0, "test", 64) if "'" in scene.sentences[0].french_text][:1] or pytest.skip("no d' among 40 scenes")
    with pytest.raises(UserError, match=r"this model splits the French .* into .*d ' .*data.tokenizer.kind=space"):
        evaluate_scenes(comparer, scenes, importance=False, progress=False)
