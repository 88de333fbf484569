"""Shared fixtures: tiny sizes, CPU, no network."""

from __future__ import annotations

import importlib
import os
import random
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
if str(ROOT) not in sys.path:  # so tests can import data_scripts/ (and bench/ helpers) from the checkout
    sys.path.insert(0, str(ROOT))

from attnkit.config import DecoderConfig, ExperimentConfig, TextEncoderConfig  # noqa: E402
from attnkit.data.sources import default_data_root  # noqa: E402
from attnkit.data.text import write_parallel_dataset  # noqa: E402
from attnkit.model import build_translation_model  # noqa: E402
from attnkit.train import TrainingProgress  # noqa: E402
from attnkit.vocab import Vocabulary  # noqa: E402

torch.set_num_threads(min(2, torch.get_num_threads()))
# the benchmarks the tests run (and their subprocesses) sample the load and calibrate the machine in a fiftieth of
# the time (bench/machine.py): their figures are not measurements
os.environ.setdefault("ATTNKIT_PROBE_SCALE", "0.02")

TOY_WORDS = "a b c d e f g h".split()


def reverse_pair(rng: random.Random, shortest: int = 2, longest: int = 6) -> tuple[str, str]:
    """Toy translation: the target is the source reversed and upper-cased (alignments cross)."""
    words = [rng.choice(TOY_WORDS) for _ in range(rng.randint(shortest, longest))]
    return " ".join(words), " ".join(w.upper() for w in reversed(words))


@pytest.fixture(scope="session")
def toy_data(tmp_path_factory) -> Path:
    """A prepared dataset folder of the reversal task (languages 'src' and 'tgt')."""
    rng = random.Random(0)
    folder = tmp_path_factory.mktemp("toy")
    splits = {"train": [reverse_pair(rng) for _ in range(1500)], "valid": [reverse_pair(rng) for _ in range(60)], "test": [reverse_pair(rng) for _ in range(60)]}
    return write_parallel_dataset(folder, ("src", "tgt"), splits)


@pytest.fixture(scope="session")
def small_toy_data(tmp_path_factory) -> Path:
    """The reversal task with 320 training pairs (10 batches of 32): for what one epoch of any length shows
    (compiled against eager, resuming) at a fifth of toy_data's cost."""
    rng = random.Random(1)
    folder = tmp_path_factory.mktemp("small-toy")
    splits = {"train": [reverse_pair(rng) for _ in range(320)], "valid": [reverse_pair(rng) for _ in range(16)], "test": [reverse_pair(rng) for _ in range(16)]}
    return write_parallel_dataset(folder, ("src", "tgt"), splits)


@pytest.fixture
def vocab() -> Vocabulary:
    return Vocabulary.build([["w%d" % i for i in range(7)]])  # 4 specials + 7 words


# decoder settings of a tiny Transformer for tiny_config / tiny_model: 2 layers of 2 heads over a model size of 8
TINY_TRANSFORMER = dict(family="transformer", embedding_size=8, hidden_size=8, heads=2, num_layers=2, feedforward_size=12)


def tiny_config(**decoder) -> ExperimentConfig:
    encoder = TextEncoderConfig(embedding_size=6, hidden_size=5, dropout=0.0)
    settings = dict(embedding_size=6, hidden_size=10, attention_size=7, dropout=0.0)
    settings.update(decoder)
    return ExperimentConfig(text_encoder=encoder, decoder=DecoderConfig(**settings))


def tiny_model(vocab: Vocabulary, seed: int = 0, **decoder):
    torch.manual_seed(seed)
    return build_translation_model(tiny_config(**decoder), vocab, vocab).eval()


def shared_data_root() -> Path:
    return default_data_root(ROOT)


def needs_shared(*parts: str) -> Path:
    """The path under the shared data root; the test is skipped, saying so, when it is absent."""
    path = shared_data_root().joinpath(*parts)
    if not path.exists():
        pytest.skip(f"shared data not found: {path} (set ATTNKIT_DATA to the folder holding multi30k/, tatoeba-eng-fra/ and flickr8k/)")
    return path


def standing_run_folder(folder: Path, config: dict, epoch: int, stop_reason: str = "", best: bool = True) -> None:
    """A run folder as training leaves it, for the benches' reuse of runs: last.pt with the config and progress
    (weights are not read), best.pt beside it."""
    folder.mkdir(parents=True)
    torch.save({"config": config, "training": {"progress": vars(TrainingProgress(epoch=epoch, stop_reason=stop_reason))}}, folder / "last.pt")
    if best:
        (folder / "best.pt").write_bytes(b"")


@pytest.fixture
def bench(monkeypatch):
    """``bench(name)``: a benchmark's module, imported from bench/. Afterwards every bench/ module it imported
    (the script and its helpers: flickr8k, machine) is forgotten, so no test sees another's monkeypatched copy."""
    monkeypatch.syspath_prepend(str(BENCH))
    yield importlib.import_module
    for name, module in list(sys.modules.items()):
        if Path(getattr(module, "__file__", None) or "/").parent == BENCH:
            sys.modules.pop(name, None)
