import pytest
import torch

from attnkit.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from attnkit.config import to_dict
from attnkit.data.batching import pad_sequences
from attnkit.errors import UserError
from attnkit.model import build_translation_model
from attnkit.search import beam_search
from attnkit.vocab import Vocabulary
from conftest import tiny_config, tiny_model


def _save(tmp_path, model, vocab, task="translation"):
    checkpoint = Checkpoint(task, to_dict(tiny_config(style="bahdanau")), {"source": vocab.to_list(), "target": vocab.to_list()}, model.state_dict())
    return save_checkpoint(tmp_path / "model.pt", checkpoint)


def test_round_trip_gives_identical_outputs_and_loads_weights_only(tmp_path, vocab):
    model = tiny_model(vocab, style="bahdanau")
    path = _save(tmp_path, model, vocab)
    raw = torch.load(path, weights_only=True)  # no pickled objects: loading cannot run code
    assert raw["format"] == "attnkit-checkpoint" and raw["task"] == "translation"

    loaded = load_checkpoint(path, task="translation")
    rebuilt = build_translation_model(tiny_config(style="bahdanau"), Vocabulary(loaded.vocabularies["source"]), Vocabulary(loaded.vocabularies["target"])).eval()
    rebuilt.load_state_dict(loaded.model)
    source = pad_sequences([[4, 5, 6], [7, 8]])
    before = beam_search(model.decoder, model.encode(source), 2, 3, beam_size=3, max_length=6)
    after = beam_search(rebuilt.decoder, rebuilt.encode(source), 2, 3, beam_size=3, max_length=6)
    for (a,), (b,) in zip(before, after):
        assert a.tokens == b.tokens and a.score == b.score
        assert torch.equal(a.attention, b.attention)
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"], "no temporary file is left behind"


def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path, vocab, monkeypatch):
    model = tiny_model(vocab)
    path = _save(tmp_path, model, vocab)
    before = path.read_bytes()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError):
        _save(tmp_path, model, vocab)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]


def test_wrong_task_missing_corrupt_and_foreign_files(tmp_path, vocab):
    path = _save(tmp_path, tiny_model(vocab), vocab, task="captioning")
    with pytest.raises(UserError, match="'captioning' checkpoint, but this command needs a 'translation'"):
        load_checkpoint(path, task="translation")
    with pytest.raises(UserError, match="not found"):
        load_checkpoint(tmp_path / "absent.pt")
    with pytest.raises(UserError, match="directory"):
        load_checkpoint(tmp_path)
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(UserError, match="not a readable attnkit checkpoint"):
        load_checkpoint(tmp_path / "garbage.pt")
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(path.read_bytes()[:200])
    with pytest.raises(UserError, match="not a readable attnkit checkpoint"):
        load_checkpoint(truncated)
    torch.save({"weights": torch.zeros(2)}, tmp_path / "foreign.pt")
    with pytest.raises(UserError, match="not an attnkit checkpoint"):
        load_checkpoint(tmp_path / "foreign.pt")


class Payload:
    """Stands for an arbitrary pickled object, which weights_only loading must refuse."""


def test_a_checkpoint_with_pickled_code_is_refused(tmp_path):
    torch.save({"format": "attnkit-checkpoint", "object": Payload()}, tmp_path / "evil.pt")
    with pytest.raises(UserError, match="not a readable attnkit checkpoint"):
        load_checkpoint(tmp_path / "evil.pt")


def test_other_format_version_is_explained(tmp_path):
    torch.save({"format": "attnkit-checkpoint", "format_version": 99, "attnkit_version": "9.0"}, tmp_path / "future.pt")
    with pytest.raises(UserError, match="format 99"):
        load_checkpoint(tmp_path / "future.pt")
