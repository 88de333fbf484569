"""Damaged checkpoints: whatever is wrong with the file, loading it is a UserError or a usable checkpoint.

~400 deterministic corruptions of a small real checkpoint: truncations, byte flips, random
bytes, edits of the archive's members that keep its checksums valid (so they reach the
unpickler and the payload checks), and edits of the payload itself. Each one must either
load into a valid Checkpoint whose weights then load into the model (or fail to, with a
UserError from load_weights), or raise a UserError: never any other exception.
"""

import io
import random
import time
import warnings
import zipfile
from collections import Counter

import pytest
import torch

from attnkit.checkpoint import FORMAT_VERSION, Checkpoint, load_checkpoint, load_weights, save_checkpoint
from attnkit.config import ExperimentConfig, from_dict, to_dict
from attnkit.errors import UserError
from attnkit.vocab import Vocabulary
from conftest import tiny_config, tiny_model

WRONG_VALUES = [None, "x", [], torch.zeros(2)]


def _payload(model, vocab) -> dict:
    optimizer = torch.optim.Adam(model.parameters())
    training = {"progress": {"epoch": 1}, "history": [], "optimizer": optimizer.state_dict(), "scheduler": {}, "scaler": {}, "rng": [{"cpu": torch.get_rng_state()}]}
    config = to_dict(tiny_config())
    return {"task": "translation", "config": config, "vocabularies": {"source": vocab.to_list(), "target": vocab.to_list()}, "model": model.state_dict(), "training": training}


def _bytes(payload: dict) -> bytes:
    """What save_checkpoint writes, in memory (its fsyncs would double this test's time)."""
    buffer = io.BytesIO()
    torch.save({"format": "attnkit-checkpoint", "format_version": FORMAT_VERSION, "attnkit_version": "0.1.0", **payload}, buffer)
    return buffer.getvalue()


def _rezip(data: bytes, edit) -> bytes:
    """The archive rewritten member by member through ``edit(name, content) -> [(name, content), ...]`` (checksums stay valid)."""
    source = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(out, "w") as target:
        warnings.simplefilter("ignore")  # a duplicate member name is one of the edits
        for member in source.infolist():
            for name, content in edit(member.filename, source.read(member)):
                target.writestr(name, content)
    return out.getvalue()


def _raw_cases(data: bytes, rng: random.Random):
    size = len(data)
    offsets = sorted({0, 1, 2, 4, 30, 100, size // 2, size - 1, size - 22, size - 23, *(rng.randrange(size) for _ in range(40)), *range(size - 30, size, 3)})
    for offset in offsets:
        yield f"truncated at {offset}", data[:offset]
    for i in range(50):
        flipped = bytearray(data)
        offset = rng.randrange(size)
        flipped[offset] ^= rng.randrange(1, 256)
        yield f"flip {i} at {offset}", bytes(flipped)
    yield "appended junk", data + bytes(rng.randrange(256) for _ in range(100))
    for i in range(12):
        yield f"random bytes {i}", bytes(rng.randrange(256) for _ in range(rng.randrange(1, 3000)))
    yield "zip magic then random", b"PK\x03\x04" + bytes(rng.randrange(256) for _ in range(500))
    yield "an empty zip", _rezip(data, lambda name, content: [])


def _member_cases(data: bytes, rng: random.Random):
    names = [m.filename for m in zipfile.ZipFile(io.BytesIO(data)).infolist()]
    for target in names:
        yield f"without {target}", _rezip(data, lambda name, content, t=target: [] if name == t else [(name, content)])
        yield f"{target} halved", _rezip(data, lambda name, content, t=target: [(name, content[: len(content) // 2] if name == t else content)])
        yield f"{target} random", _rezip(data, lambda name, content, t=target: [(name, bytes(rng.randrange(256) for _ in content) if name == t else content)])
    pickle_name = next(n for n in names if n.endswith("data.pkl"))
    pickled = zipfile.ZipFile(io.BytesIO(data)).read(pickle_name)
    for i in range(70):  # the unpickler's own input, with a valid checksum
        edited = bytearray(pickled)
        offset = rng.randrange(len(edited))
        edited[offset] = rng.randrange(256)
        yield f"data.pkl byte {offset} set", _rezip(data, lambda name, content, e=bytes(edited): [(name, e if name == pickle_name else content)])
    for offset in sorted(rng.sample(range(len(pickled)), 15)):
        yield f"data.pkl cut at {offset}", _rezip(data, lambda name, content, o=offset: [(name, content[:o] if name == pickle_name else content)])
    yield "data.pkl renamed", _rezip(data, lambda name, content: [(name + "x" if name == pickle_name else name, content)])
    yield "data.pkl twice", _rezip(data, lambda name, content: [(name, content)] * (2 if name == pickle_name else 1))
    yield "version 99", _rezip(data, lambda name, content: [(name, b"99" if name.endswith("/version") else content)])
    yield "big endian", _rezip(data, lambda name, content: [(name, b"big" if name.endswith("byteorder") else content)])


def _payload_cases(payload: dict):
    def variant(**changes) -> bytes:
        return _bytes({**payload, **changes})

    for key in ("task", "config", "vocabularies", "model", "training"):
        for value in WRONG_VALUES:
            yield f"{key} = {type(value).__name__}", variant(**{key: value})
    for section in payload["config"]:
        yield f"config without {section}", variant(config={k: v for k, v in payload["config"].items() if k != section})
        yield f"config.{section} = -1", variant(config={**payload["config"], section: -1})
    yield "config.decoder.hidden_size = -3", variant(config={**payload["config"], "decoder": {**payload["config"]["decoder"], "hidden_size": -3}})
    yield "config.decoder.hidden_size = 11", variant(config={**payload["config"], "decoder": {**payload["config"]["decoder"], "hidden_size": 11}})
    yield "legacy search.n_best", variant(config={**payload["config"], "search": {**payload["config"]["search"], "n_best": 1}})
    for side in ("source", "target"):
        yield f"no {side} vocabulary", variant(vocabularies={k: v for k, v in payload["vocabularies"].items() if k != side})
        yield f"{side} vocabulary without specials", variant(vocabularies={**payload["vocabularies"], side: payload["vocabularies"][side][4:]})
        yield f"{side} vocabulary with a repeat", variant(vocabularies={**payload["vocabularies"], side: [*payload["vocabularies"][side], "w1"]})
        yield f"{side} vocabulary one word longer", variant(vocabularies={**payload["vocabularies"], side: [*payload["vocabularies"][side], "new"]})
        yield f"{side} vocabulary of numbers", variant(vocabularies={**payload["vocabularies"], side: list(range(10))})
    weights = payload["model"]
    for i, name in enumerate(list(weights)[:: max(1, len(weights) // 6)]):
        yield f"without weight {name}", variant(model={k: v for k, v in weights.items() if k != name})
        yield f"{name} reshaped", variant(model={**weights, name: torch.zeros(3, 3)})
        yield f"{name} of ints", variant(model={**weights, name: weights[name].long()})
        yield f"{name} a list", variant(model={**weights, name: [1.0]})
    yield "an extra weight", variant(model={**weights, "decoder.extra": torch.zeros(2)})
    yield "half precision weights", variant(model={k: v.half() for k, v in weights.items()})
    for key in ("progress", "optimizer", "scheduler", "rng"):
        yield f"training without {key}", variant(training={k: v for k, v in payload["training"].items() if k != key})
    for rng in ([], [{"cpu": torch.zeros(3)}], [{"cpu": torch.get_rng_state(), "cuda": [1]}], {"cpu": torch.get_rng_state()}):
        yield f"training rng {rng!r:.30}", variant(training={**payload["training"], "rng": rng})
    yield "training with the old torch_rng", variant(training={**{k: v for k, v in payload["training"].items() if k != "rng"}, "torch_rng": torch.get_rng_state()})
    yield "training for inference only", variant(training={})
    for change in ({"format": "other"}, {"format_version": 0}, {"format_version": 1}, {"format_version": FORMAT_VERSION + 1}, {"format_version": "1"}, {"format_version": True}, {"format_version": torch.ones(2)}, {"format": torch.ones(2)}, {"attnkit_version": ["x" * 100]}):
        yield f"header {change}", variant(**change)
    buffer = io.BytesIO()
    torch.save([payload], buffer)
    yield "a list of payloads", buffer.getvalue()


@pytest.mark.slow  # about 5 s: hundreds of torch.load calls
def test_every_damaged_checkpoint_loads_or_is_a_user_error(tmp_path, vocab):
    rng = random.Random(1234)
    model = tiny_model(vocab)
    payload = _payload(model, vocab)
    data = save_checkpoint(tmp_path / "base.pt", Checkpoint(**payload)).read_bytes()
    cases = [("intact", data), *_raw_cases(data, rng), *_member_cases(data, rng), *_payload_cases(payload)]
    assert len(cases) >= 300

    path = tmp_path / "case.pt"
    outcomes, failures, slowest = Counter(), [], (0.0, "")
    for name, content in cases:
        path.write_bytes(content)
        started = time.perf_counter()
        try:
            checkpoint = load_checkpoint(path)
        except UserError as error:
            outcomes["refused"] += 1
            if "weights_only" in str(error) or not str(error).isprintable():
                failures.append(f"{name}: message relays torch or spans lines: {error}")
            continue
        except Exception as error:  # noqa: BLE001 - what this test looks for
            failures.append(f"{name}: load_checkpoint raised {type(error).__name__}: {error}")
            continue
        try:  # a checkpoint that loads must rebuild: its config, vocabularies, weights
            assert isinstance(checkpoint, Checkpoint) and checkpoint.task == "translation"
            config = from_dict(ExperimentConfig, checkpoint.config)
            assert config.decoder.hidden_size >= 1
            Vocabulary(checkpoint.vocabularies["source"]), Vocabulary(checkpoint.vocabularies["target"])
            load_weights(model, checkpoint)
            outcomes["loaded"] += 1
        except UserError as error:
            outcomes["weights refused"] += 1
            if "do not fit this model" not in str(error) or not str(error).isprintable():
                failures.append(f"{name}: unexpected message {error!r}")
        except Exception as error:  # noqa: BLE001
            failures.append(f"{name}: a loaded checkpoint failed with {type(error).__name__}: {error}")
        finally:
            slowest = max(slowest, (time.perf_counter() - started, name))
    assert not failures, f"{len(failures)} of {len(cases)} cases:\n" + "\n".join(failures[:20])
    assert outcomes["loaded"] >= 5 and outcomes["refused"] >= 250 and outcomes["weights refused"] >= 5, outcomes
    # No damaged file may make loading hang or balloon (a length field read as gigabytes): each case takes some
    # 10 ms; a bound per case, not on the whole run, holds on a loaded machine too.
    assert slowest[0] < 5, f"{slowest[1]} took {slowest[0]:.1f} s to load or refuse"
