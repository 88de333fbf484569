"""Masked-language-model pre-training: BERT's masking on a hand-made batch, and the task end to end."""

import json

import pytest
import torch

from attnkit.checkpoint import load_checkpoint
from attnkit.commands import evaluate, serve, train
from attnkit.errors import run_cli
from attnkit.interfaces import PaddedTokens
from attnkit.config import TextEncoderConfig
from attnkit.data.batching import Batch
from attnkit.encoders.text import build_text_encoder
from attnkit.host_reads import HostReads
from attnkit.pretraining import FIRST_ORDINARY, MASK_ID, Masking, MaskedLanguageModel, MaskedLanguageObjective, chosen_positions
from attnkit.vocab import Vocabulary

VOCAB_SIZE = 1000


def hand_made_batch() -> PaddedTokens:
    """Three sentences of ordinary pieces with specials among them (<unk>, <eos>) and padding at the end."""
    unk, eos = Vocabulary.unk_index, Vocabulary.eos_index
    rows = [
        [10, 11, 12, unk, 13, 14, 15, 16, 17, 18],
        [20, eos, 21, 22, 23, 0, 0, 0, 0, 0],
        [30, 31, unk, 32, 0, 0, 0, 0, 0, 0],
    ]
    return PaddedTokens(torch.tensor(rows), torch.tensor([10, 5, 4]))


def test_masking_keeps_berts_proportions_and_never_touches_padding_or_special_pieces():
    source = hand_made_batch()
    ids = source.ids
    ordinary = ids >= FIRST_ORDINARY
    generator = torch.Generator().manual_seed(0)
    chosen_count = masked = randomised = kept = 0
    draws = 4000
    for _ in range(draws):
        out, chosen = Masking()(source, VOCAB_SIZE, generator)
        assert not chosen[~ordinary].any()  # padding and specials are never chosen ...
        assert torch.equal(out.ids[~chosen], ids[~chosen])  # ... and nothing else changes
        assert torch.equal(out.lengths, source.lengths)
        picked, original = out.ids[chosen], ids[chosen]
        chosen_count += int(chosen.sum())
        masked += int((picked == MASK_ID).sum())
        replaced = (picked != MASK_ID) & (picked != original)
        assert (picked[replaced] >= FIRST_ORDINARY).all()  # a random piece is an ordinary one
        randomised += int(replaced.sum())
        kept += int((picked == original).sum())
    assert chosen_count / (draws * int(ordinary.sum())) == pytest.approx(0.15, abs=0.005)
    assert masked / chosen_count == pytest.approx(0.8, abs=0.01)
    assert randomised / chosen_count == pytest.approx(0.1, abs=0.01)  # a random draw equal to the original counts as kept (1 in 996)
    assert kept / chosen_count == pytest.approx(0.1, abs=0.01)


def test_masking_with_a_seeded_generator_repeats_itself():
    source = hand_made_batch()
    first = Masking()(source, VOCAB_SIZE, torch.Generator().manual_seed(3))
    again = Masking()(source, VOCAB_SIZE, torch.Generator().manual_seed(3))
    assert torch.equal(first[0].ids, again[0].ids) and torch.equal(first[1], again[1])



def test_a_pretraining_step_reads_from_the_device_once_and_heads_the_chosen_pieces_in_order():
    """The chosen pieces' number is drawn, so finding them is a host read (a GPU synchronisation): the step makes it
    once, for both the head and the answers, and takes them in the order a boolean index would."""
    torch.manual_seed(0)
    config = TextEncoderConfig(family="transformer", embedding_size=16, hidden_size=16, num_layers=1, heads=2, feedforward_size=32)
    model = MaskedLanguageModel(build_text_encoder(config, VOCAB_SIZE), VOCAB_SIZE)
    source = hand_made_batch()
    _, chosen = Masking(rate=0.5)(source, VOCAB_SIZE, torch.Generator().manual_seed(1))
    assert torch.equal(source.ids.flatten()[chosen_positions(chosen)], source.ids[chosen])
    with HostReads() as found:
        out = MaskedLanguageObjective(VOCAB_SIZE)(model, Batch(source, source.ids, torch.arange(3)))
        out.loss().backward()
    assert len(found.reads) == 1 and found.reads[0].startswith("nonzero at attnkit/pretraining.py:") and "chosen_positions" in found.reads[0], found.reads
    assert out.tokens > 0 and model.transform[0].weight.grad is not None

@pytest.fixture(autouse=True)
def project_root(monkeypatch):
    from conftest import ROOT

    monkeypatch.chdir(ROOT)


def test_the_tiny_pretrain_recipe_trains_resumes_and_is_refused_where_a_translator_is_needed(toy_data, tmp_path, capsys):
    run_dir = tmp_path / "pretrain"
    argv = ["--config", "tasks/configs/tiny_pretrain.yaml", "--no-progress", "--set", f"data.path={toy_data}", "--set", f"output_dir={run_dir}", "--set", "train.epochs=1"]
    assert run_cli(train.main, argv) == 0
    records = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    assert set(records[0]["valid"]) == {"accuracy", "perplexity", "score"} and 0 <= records[0]["valid"]["accuracy"] <= 100
    checkpoint = load_checkpoint(run_dir / "best.pt")
    assert checkpoint.task == "pretrain" and any(key.startswith("encoder.layers") for key in checkpoint.model)
    assert run_cli(train.main, ["--resume", str(run_dir / "last.pt"), "--no-progress", "--set", "train.epochs=2"]) == 0
    assert [json.loads(line)["epoch"] for line in (run_dir / "log.jsonl").read_text().splitlines()] == [1, 2]
    capsys.readouterr()
    assert run_cli(evaluate.main, ["--checkpoint", str(run_dir / "best.pt"), "--split", "test"]) == 2
    assert "'pretrain' checkpoint" in capsys.readouterr().err
    assert run_cli(serve.main, ["--checkpoint", str(run_dir / "best.pt"), "--port", "0"]) == 2
    assert "a pre-training checkpoint (task pretrain)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "lines, warning",
    [
        (["", "  ", ""], "warning: data.pretrain_text: no line of {path} holds a word; pre-training reads the training pairs alone"),
        (["zzq yyq", "xxq", "a"], "warning: data.pretrain_text: 75% of the words of {path} are not in the training pairs' vocabulary"),
        (["a b c", "", "d e"], None),
    ],
)
def test_more_pretraining_text_says_how_many_lines_were_used_and_warns_when_they_bring_little(toy_data, tmp_path, lines, warning):
    from attnkit.config import load_config
    from attnkit.pretraining import prepare_pretraining

    path = tmp_path / "more.txt"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    setup = prepare_pretraining(load_config("tasks/configs/tiny_pretrain.yaml", [f"data.path={toy_data}", f"data.pretrain_text={path}"]), None, None)
    used = sum(bool(line.strip()) for line in lines)
    expected = f"pretrain: masked pieces of {len(setup.dataset)} src sentences ({len(setup.dataset) - used} from the training pairs, {used} of the {len(lines)} lines of {path})"
    assert setup.notes[0].startswith(expected)
    said = [note for note in setup.notes if note.startswith("warning:")]
    assert [note.startswith(warning.format(path=path)) for note in said] == ([True] if warning else [])


def test_pretraining_an_rnn_encoder_is_refused_with_the_reason(toy_data, tmp_path, capsys):
    argv = ["--config", "tasks/configs/tiny.yaml", "--no-progress", "--set", "task=pretrain", "--set", f"data.path={toy_data}", "--set", f"output_dir={tmp_path / 'run'}"]
    assert run_cli(train.main, argv) == 2
    assert "text_encoder.family: transformer" in capsys.readouterr().err
    assert not (tmp_path / "run" / "last.pt").exists()


@pytest.fixture(scope="module")
def pretrained(toy_data, tmp_path_factory):
    """A pre-trained tiny encoder (tiny_pretrain.yaml on the toy data) -> its best.pt."""
    from conftest import ROOT

    run_dir = tmp_path_factory.mktemp("pretrained")
    argv = ["--config", str(ROOT / "tasks/configs/tiny_pretrain.yaml"), "--no-progress", "--set", f"data.path={toy_data}", "--set", f"output_dir={run_dir}", "--set", "train.epochs=1"]
    assert run_cli(train.main, argv) == 0
    return run_dir / "best.pt"


def translator_argv(toy_data, run_dir, *overrides):
    settings = [f"data.path={toy_data}", f"output_dir={run_dir}", "train.epochs=1", *overrides]
    return ["--config", "tasks/configs/tiny_transformer.yaml", "--no-progress", *(a for o in settings for a in ("--set", o))]


def test_a_translator_starts_from_the_pretrained_encoder_and_holds_it_still_while_frozen(pretrained, toy_data, tmp_path, capsys):
    run_dir = tmp_path / "translator"
    assert run_cli(train.main, translator_argv(toy_data, run_dir, f"text_encoder.init_from={pretrained}", "text_encoder.frozen_steps=1000000")) == 0
    assert f"text encoder from {pretrained}" in capsys.readouterr().out
    encoder = {name: w for name, w in load_checkpoint(pretrained).model.items() if name.startswith("encoder.")}
    trained = load_checkpoint(run_dir / "last.pt").model
    assert all(torch.equal(trained[name.replace("encoder.", "encoders.text.", 1)], w) for name, w in encoder.items())  # held still all along
    resumed = ["--resume", str(run_dir / "last.pt"), "--no-progress", "--set", "train.epochs=2", "--set", "text_encoder.frozen_steps=0"]
    assert run_cli(train.main, resumed) == 0  # how long it is held still may change on resume: the encoder trains on
    moved = load_checkpoint(run_dir / "last.pt").model
    assert not all(torch.equal(moved[name.replace("encoder.", "encoders.text.", 1)], w) for name, w in encoder.items())
    fresh = tmp_path / "thawed"
    assert run_cli(train.main, translator_argv(toy_data, fresh, f"text_encoder.init_from={pretrained}")) == 0
    thawed = load_checkpoint(fresh / "last.pt").model
    assert not all(torch.equal(thawed[name.replace("encoder.", "encoders.text.", 1)], w) for name, w in encoder.items())  # it trains on


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data.max_vocab=4"], "another source vocabulary"),
        (["text_encoder.num_layers=1"], "holds another encoder: text_encoder.num_layers 2 there, 1 here"),
        (["text_encoder.family=rnn"], "holds another encoder: text_encoder.family transformer there, rnn here"),
        (["text_encoder.init_from=nowhere/best.pt"], "does not exist"),
        (["text_encoder.init_from={run}"], "text_encoder.init_from: {run} is a folder, not a checkpoint file (did you mean {run}/best.pt?)"),
        (["task=captioning"], "starts a translator (task translation)"),
    ],
)
def test_a_pretrained_encoder_that_does_not_fit_is_refused_with_the_reason(pretrained, toy_data, tmp_path, capsys, overrides, message):
    run_dir = tmp_path / "translator"
    overrides = [override.format(run=pretrained.parent) for override in overrides]
    assert run_cli(train.main, translator_argv(toy_data, run_dir, f"text_encoder.init_from={pretrained}", *overrides)) == 2
    assert message.format(run=pretrained.parent) in capsys.readouterr().err
    assert not run_dir.exists() or not any(run_dir.iterdir())


def test_a_checkpoint_of_another_task_is_refused_as_a_pretrained_encoder(toy_data, tmp_path, capsys):
    translator = tmp_path / "translator"
    assert run_cli(train.main, translator_argv(toy_data, translator)) == 0
    capsys.readouterr()
    assert run_cli(train.main, translator_argv(toy_data, tmp_path / "second", f"text_encoder.init_from={translator / 'best.pt'}")) == 2
    assert "'translation' checkpoint, but this command needs a 'pretrain' checkpoint" in capsys.readouterr().err


def test_frozen_steps_need_a_pretrained_encoder(toy_data, tmp_path, capsys):
    assert run_cli(train.main, translator_argv(toy_data, tmp_path / "run", "text_encoder.frozen_steps=5")) == 2
    assert "set text_encoder.init_from too" in capsys.readouterr().err


def test_head_statistics_read_what_a_hand_made_head_looks_at():
    from attnkit.analysis import HeadStatistics, is_punctuation

    lengths = torch.tensor([4, 3])
    previous = torch.zeros(2, 4, 4)  # head 1: each word on the one before (the first on itself)
    for i in range(4):
        previous[:, i, max(i - 1, 0)] = 1.0
    uniform = torch.zeros(2, 4, 4)  # head 2: evenly over the sentence's real words
    uniform[0] = 1 / 4
    uniform[1, :, :3] = 1 / 3
    maps = [torch.stack([previous, uniform], dim=1)]  # one layer, (B, h, S, S)
    punctuation = torch.tensor([[False, False, False, True], [False, False, False, False]])  # "a b c ." and "a b c"
    statistics = HeadStatistics()
    statistics.add(maps, lengths, punctuation)
    means = statistics.means()
    assert means["previous"][0][0] == 1.0 and means["self"][0][0] == pytest.approx(2 / 7, abs=1e-4)  # 2 first words of 7 attend to themselves
    assert means["next"][0][0] == 0.0 and means["peak"][0][0] == 1.0 and means["effective_positions"][0][0] == pytest.approx(1.0, abs=1e-4)
    assert means["normalised_entropy"][0][1] == pytest.approx(1.0, abs=1e-4)  # uniform over each sentence's words
    assert means["previous"][0][1] == pytest.approx((3 * 1 / 4 + 2 * 1 / 3) / 5, abs=1e-4)
    assert means["punctuation"][0][1] == pytest.approx(1 / 4, abs=1e-4)  # counted over the sentence that has punctuation
    assert is_punctuation(".") and is_punctuation("\u2581,") and not is_punctuation("\u2581") and not is_punctuation("l'")
