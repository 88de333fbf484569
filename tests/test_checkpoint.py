import dataclasses
import errno
import io

import pytest
import torch

from attnkit import checkpoint as checkpoint_module
from attnkit import files as files_module
from attnkit.checkpoint import Checkpoint, load_checkpoint, load_weights, save_checkpoint
from attnkit.config import ExperimentConfig, TrainConfig, from_dict, to_dict
from attnkit.data.batching import pad_sequences
from attnkit.errors import UserError
from attnkit.model import build_translation_model, model_from_checkpoint
from attnkit.search import beam_search
from conftest import TINY_TRANSFORMER, tiny_config, tiny_model


def _save(tmp_path, model, vocab, task="translation", **decoder):
    config = to_dict(tiny_config(**(decoder or dict(style="bahdanau"))))
    checkpoint = Checkpoint(task, config, {"source": vocab.to_list(), "target": vocab.to_list()}, model.state_dict())
    return save_checkpoint(tmp_path / "model.pt", checkpoint)


@pytest.mark.parametrize("decoder", [dict(style="bahdanau"), TINY_TRANSFORMER], ids=["rnn", "transformer"])
def test_round_trip_gives_identical_outputs_and_loads_weights_only(tmp_path, vocab, decoder):
    model = tiny_model(vocab, **decoder)
    path = _save(tmp_path, model, vocab, **decoder)
    raw = torch.load(path, weights_only=True)  # no pickled objects: loading cannot run code
    assert raw["format"] == "attnkit-checkpoint" and raw["task"] == "translation"

    loaded = load_checkpoint(path, task="translation")
    rebuilt = model_from_checkpoint(loaded).eval()
    load_weights(rebuilt, loaded)
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
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(UserError, match="not a readable attnkit checkpoint: the file is empty"):
        load_checkpoint(tmp_path / "empty.pt")
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(path.read_bytes()[:200])
    with pytest.raises(UserError, match="not a readable attnkit checkpoint"):
        load_checkpoint(truncated)
    torch.save({"weights": torch.zeros(2)}, tmp_path / "foreign.pt")
    with pytest.raises(UserError, match="not an attnkit checkpoint"):
        load_checkpoint(tmp_path / "foreign.pt")


class Payload:
    """Stands for an arbitrary pickled object, which weights_only loading must refuse."""


def test_a_checkpoint_with_pickled_code_is_refused_without_relaying_torchs_advice(tmp_path):
    torch.save({"format": "attnkit-checkpoint", "object": Payload()}, tmp_path / "evil.pt")
    with pytest.raises(UserError, match="not a readable attnkit checkpoint") as error:
        load_checkpoint(tmp_path / "evil.pt")
    assert "weights_only" not in str(error.value)


def test_a_format_1_checkpoint_names_its_one_encoder_encoder_and_still_loads(tmp_path, vocab):
    model = tiny_model(vocab, style="bahdanau")
    old_names = {name.replace("encoders.text.", "encoder."): tensor for name, tensor in model.state_dict().items()}
    assert any(name.startswith("encoder.") for name in old_names)
    torch.save(_payload(vocab, model, format_version=1, model=old_names, config=to_dict(tiny_config(style="bahdanau"))), tmp_path / "old.pt")
    rebuilt = build_translation_model(tiny_config(style="bahdanau"), vocab, vocab).eval()
    load_weights(rebuilt, load_checkpoint(tmp_path / "old.pt"))
    source = pad_sequences([[4, 5, 6], [7, 8]])
    before = beam_search(model.decoder, model.encode(source), 2, 3, beam_size=3, max_length=6)
    after = beam_search(rebuilt.decoder, rebuilt.encode(source), 2, 3, beam_size=3, max_length=6)
    assert [[h.tokens for h in hyps] for hyps in before] == [[h.tokens for h in hyps] for hyps in after]


def test_other_format_version_is_explained(tmp_path):
    torch.save({"format": "attnkit-checkpoint", "format_version": 99, "attnkit_version": "9.0"}, tmp_path / "future.pt")
    with pytest.raises(UserError, match="format 99"):
        load_checkpoint(tmp_path / "future.pt")


def _payload(vocab, network, **changes) -> dict:
    payload = {
        "format": "attnkit-checkpoint",
        "format_version": checkpoint_module.FORMAT_VERSION,
        "attnkit_version": "0.1.0",
        "task": "translation",
        "config": to_dict(tiny_config()),
        "vocabularies": {"source": vocab.to_list(), "target": vocab.to_list()},
        "model": network.state_dict(),
        "training": {},
    }
    payload.update(changes)
    return {k: v for k, v in payload.items() if v is not DROP}


DROP = object()


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(config=DROP), "holds no config"),
        (dict(model=DROP), "no model weights"),
        (dict(vocabularies=DROP), "holds no vocabularies"),
        (dict(task=DROP), "unknown task None"),
        (dict(task="summary"), "unknown task summary"),
        (dict(task=["translation"]), "unknown task"),
        (dict(config=["decoder"]), "holds no config"),
        (dict(config={"decoder": {"hidden_size": -3}}), "config key decoder.hidden_size must be at least 1"),
        (dict(config={"decoder": {"colour": "red"}}), "unknown config key decoder.colour"),
        (dict(vocabularies={"target": ["<pad>", "<unk>", "<bos>", "<eos>"]}), "no source vocabulary"),
        (dict(vocabularies={"source": "abc", "target": []}), "no source vocabulary"),
        (dict(vocabularies={"source": ["a", "b"], "target": ["a", "b"]}), "does not start with <pad>"),
        (dict(model={"w": [1, 2]}), "no model weights"),
        (dict(model={}), "no model weights"),
        (dict(training=[1]), "training state is not a dict"),
        (dict(training={"progress": {}}), "training state has no optimizer"),
        (dict(format_version=True), "checkpoint format True"),
        (dict(format_version="1"), "checkpoint format '1'"),
    ],
)
def test_a_payload_of_the_wrong_structure_is_one_user_error(tmp_path, vocab, changes, message):
    torch.save(_payload(vocab, tiny_model(vocab), **changes), tmp_path / "bad.pt")
    with pytest.raises(UserError, match=message) as error:
        load_checkpoint(tmp_path / "bad.pt")
    assert "\n" not in str(error.value)


def test_the_config_comes_back_complete_and_an_old_n_best_is_dropped(tmp_path, vocab):
    config = to_dict(tiny_config())
    config["search"]["n_best"] = 1  # written by attnkit before SearchConfig.n_best was removed
    del config["train"]
    torch.save(_payload(vocab, tiny_model(vocab), config=config), tmp_path / "old.pt")
    loaded = load_checkpoint(tmp_path / "old.pt")
    assert "n_best" not in loaded.config["search"]
    assert loaded.config == to_dict(tiny_config()), "missing sections come back with their defaults"
    assert from_dict(ExperimentConfig, loaded.config) == tiny_config()


def test_resuming_refuses_another_model_even_when_the_weights_fit(vocab):
    """Two heads instead of eight keep every weight's shape; the change is refused, with the saved and asked values."""
    saved = Checkpoint("translation", to_dict(tiny_config(**TINY_TRANSFORMER)), {"source": vocab.to_list(), "target": vocab.to_list()}, {})
    asked = tiny_config(**{**TINY_TRANSFORMER, "heads": 4})
    with pytest.raises(UserError, match=r"cannot resume: the config changes the checkpoint's model \(saved vs asked\): decoder.heads 2 vs 4; keep") as error:
        saved.refuse_another_model(asked)
    assert "\n" not in str(error.value)
    longer = dataclasses.replace(tiny_config(**TINY_TRANSFORMER), train=TrainConfig(epochs=50, max_minutes=3, device="cpu", threads=1))
    saved.refuse_another_model(longer)  # how it trains may change


def test_weights_that_do_not_fit_the_model_are_one_user_error(tmp_path, vocab):
    model = tiny_model(vocab)
    path = _save(tmp_path, model, vocab)
    checkpoint = load_checkpoint(path)
    load_weights(tiny_model(vocab, seed=1), checkpoint)
    weights = checkpoint.model
    name = next(iter(weights))
    cases = {
        "missing": ({k: v for k, v in weights.items() if k != name}, f"missing {name}"),
        "unexpected": ({**weights, "decoder.extra": torch.zeros(1)}, "unexpected decoder.extra"),
        "shape": ({**weights, name: torch.zeros(2, 2)}, rf"{name} has shape \(2, 2\)"),
        "kind": ({**weights, name: weights[name].long()}, f"{name} holds torch.int64"),
    }
    for state, message in cases.values():
        broken = Checkpoint(checkpoint.task, checkpoint.config, checkpoint.vocabularies, state)
        with pytest.raises(UserError, match=f"do not fit this model \\({message}.*incompatible version or damaged"):
            load_weights(tiny_model(vocab), broken)
    bigger = tiny_model(vocab.__class__.build([["w%d" % i for i in range(9)]]))
    with pytest.raises(UserError, match="has shape"):
        load_weights(bigger, checkpoint)


def test_a_flipped_bit_in_the_weights_fails_the_archive_checksum(tmp_path, vocab):
    model = tiny_model(vocab)
    path = _save(tmp_path, model, vocab)
    data = bytearray(path.read_bytes())
    weights = max(model.state_dict().values(), key=torch.Tensor.numel).numpy().tobytes()
    data[data.find(weights) + 5] ^= 0x10  # inside a tensor: torch would load it without a word
    path.write_bytes(bytes(data))
    with pytest.raises(UserError, match="damaged"):
        load_checkpoint(path)


def test_an_unreadable_checkpoint_says_so(tmp_path, vocab, monkeypatch):
    path = _save(tmp_path, tiny_model(vocab), vocab)

    def denied(file, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(file))

    monkeypatch.setattr(checkpoint_module, "open", denied, raising=False)  # chmod does not stop root
    with pytest.raises(UserError, match="cannot read checkpoint .*model.pt: Permission denied"):
        load_checkpoint(path)


def test_a_full_disk_names_the_checkpoint(tmp_path, vocab, monkeypatch):
    class FullDisk(io.FileIO):
        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files_module, "open", lambda path, mode: FullDisk(path, mode), raising=False)
    with pytest.raises(OSError) as error:
        _save(tmp_path, tiny_model(vocab), vocab)
    assert error.value.errno == errno.ENOSPC and error.value.filename == str(tmp_path / "model.pt")
    assert list(tmp_path.iterdir()) == []


def test_torch_serialises_in_memory_and_python_writes_the_file(tmp_path, vocab, monkeypatch):
    """torch's writer turns a failed write into a bare RuntimeError ("unexpected pos"), even over a Python
    file; Python's own write gives the OSError (ENOSPC) that the scripts report in one line."""
    seen = []
    real = torch.save
    monkeypatch.setattr(torch, "save", lambda payload, target: (seen.append(target), real(payload, target)))
    _save(tmp_path, tiny_model(vocab), vocab)
    assert isinstance(seen[0], io.BytesIO)
