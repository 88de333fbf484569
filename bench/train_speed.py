"""Training speed: attnkit's Trainer against the classic PyTorch seq2seq tutorial loop, on CPU.

Run from the project root::

    python bench/train_speed.py            # full: 500 baseline pairs, 2 attnkit epochs (~30 s on 2 cores)
    python bench/train_speed.py --quick    # the same measurement on less (~10 s)
    python bench/train_speed.py --threads 1 --seed 3
    python bench/train_speed.py --device cuda    # both sides on a GPU (default: the CPU)

Both sides train the same-sized model on the same sentence pairs in one process,
with the same number of torch CPU threads, and are measured in **target tokens per
second** (target words + ``<eos>``, as ``LossOutput.tokens`` counts them).

* **baseline**: the "NLP From Scratch: Translation with a Sequence to Sequence
  Network and Attention" training loop, written here in plain PyTorch in its
  Luong-dot variant: ONE sentence pair per update; the encoder (Embedding(V_src,
  256) -> GRU(256, 256)) runs word by word; each decoder step is Embedding(V_tgt,
  256) -> ReLU -> GRU(256, 256) -> dot attention of the new hidden state over the
  encoder outputs -> tanh(Linear(512 -> 256)([context; hidden])) -> Linear(256 ->
  V_tgt) -> log_softmax; NLL loss; teacher forcing; SGD lr 0.01 on encoder and
  decoder; ``loss.item()`` per pair, as the tutorial returns it. As in the
  tutorial the source gets an ``<eos>``, pairs are drawn at random from the pool
  and turned into tensors before the clock starts. A fixed number of pairs is
  timed after a short warm-up (it is slow).
* **attnkit**: ``ExperimentConfig`` with a unidirectional one-layer GRU encoder
  and a Luong ``dot`` decoder without input feeding (hidden 256, readout 256, no
  dropout), trained by the real ``Trainer.train_epoch`` (bucketed batches of 128,
  Adam, gradient clipping) after a warm-up of a few batches. The only extra
  parameters are the decoder's bridge (tanh(W h_enc) as the initial state), so the
  parameter counts are nearly equal; both are printed.

Data: 5,318 pairs, source vocabulary 2,579, target vocabulary 1,573, at most 8
words per side (plus ``<eos>``). Token ids are random (seeded): training speed
does not depend on which words they are. Sentence lengths follow the word counts
of the tutorial-filtered Tatoeba corpus at ``data/tatoeba-fr-en`` (its train pairs
with both sides <= 8 words, sampled jointly) when that folder is present, else
uniform in 3..8.

It also reports how close attnkit runs to the CPU's limit: the matrix-multiply
FLOPs per target token (counted by ``torch.utils.flop_counter`` on a few
batches) times its tokens/s, against the GFLOP/s of one output-layer-sized
matrix multiply on this CPU.

Human-readable lines first; the LAST line of stdout is one JSON object with every
figure. The target from the issue is attnkit >= 50x the baseline's tokens/s.
Run it on idle cores: when other work holds a core, PyTorch's threads wait on
each other and both figures (and the ratio) can drop by 10x or more; the script
says so when it sees other work just before starting (``busy_cores_before``).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from attnkit.config import DecoderConfig, ExperimentConfig, TextEncoderConfig, TrainConfig, to_dict
from attnkit.data.batching import BucketBatchSampler
from attnkit.data.text import ParallelTextDataset, collate_pairs
from attnkit.distributed import resolve_device
from attnkit.errors import run_cli
from attnkit.losses import Seq2SeqObjective
from attnkit.model import build_translation_model
from attnkit.train import CheckpointContents, Trainer
from attnkit.vocab import SPECIALS, Vocabulary
from machine import add_device_argument, best_rate, busy_cores, print_result, processor_name, usable_cores

PAIRS = 5318
SOURCE_VOCAB = 2579
TARGET_VOCAB = 1573
MAX_WORDS = 8
SIZE = 256
BATCH_SIZE = 128
TARGET_RATIO = 50.0
CORPUS = Path(__file__).resolve().parents[1] / "data" / "tatoeba-fr-en"
PAD, BOS, EOS = Vocabulary.pad_index, Vocabulary.bos_index, Vocabulary.eos_index
FIRST_WORD = len(SPECIALS)  # random word ids start after the specials


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Training speed (target tokens/s) of attnkit vs the PyTorch seq2seq tutorial loop, on one device.")
    parser.add_argument("--quick", action="store_true", help="measure on less (100 baseline pairs, a quarter of an epoch); seconds instead of half a minute")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads for both sides (0: every core this process may use)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the data, the weights and the batch order")
    add_device_argument(parser)
    return parser


# -- data ------------------------------------------------------------------------------------------
def corpus_lengths() -> list[tuple[int, int]] | None:
    """(source words, target words) of the tutorial-filtered Tatoeba train pairs with both sides <= MAX_WORDS."""
    source, target = CORPUS / "train.fr", CORPUS / "train.en"
    if not (source.is_file() and target.is_file()):
        return None
    pairs = zip(source.read_text(encoding="utf-8").splitlines(), target.read_text(encoding="utf-8").splitlines())
    lengths = [(len(s.split()), len(t.split())) for s, t in pairs]
    lengths = [(s, t) for s, t in lengths if 1 <= s <= MAX_WORDS and 1 <= t <= MAX_WORDS]
    return lengths or None


def make_pairs(seed: int) -> tuple[list[list[int]], list[list[int]], str]:
    """Random word ids (no specials) with realistic lengths; returns sources, targets and where the lengths came from."""
    rng = random.Random(seed)
    lengths = corpus_lengths()
    if lengths is not None:
        drawn = [rng.choice(lengths) for _ in range(PAIRS)]
        origin = f"joint word counts of {CORPUS.relative_to(CORPUS.parents[1])} train pairs with both sides <= {MAX_WORDS} words"
    else:
        drawn = [(rng.randint(3, MAX_WORDS), rng.randint(3, MAX_WORDS)) for _ in range(PAIRS)]
        origin = f"uniform 3..{MAX_WORDS} (no corpus at {CORPUS})"
    sources = [[rng.randrange(FIRST_WORD, SOURCE_VOCAB) for _ in range(s)] for s, _ in drawn]
    targets = [[rng.randrange(FIRST_WORD, TARGET_VOCAB) for _ in range(t)] for _, t in drawn]
    return sources, targets, origin


# -- the tutorial loop (baseline) ------------------------------------------------------------------
class TutorialEncoder(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.embedding = nn.Embedding(vocab_size, hidden_size)
        self.gru = nn.GRU(hidden_size, hidden_size)

    def forward(self, word: Tensor, hidden: Tensor) -> tuple[Tensor, Tensor]:
        embedded = self.embedding(word).view(1, 1, -1)  # (1, 1, H)
        return self.gru(embedded, hidden)  # (1, 1, H), (1, 1, H)

    def init_hidden(self) -> Tensor:
        return torch.zeros(1, 1, self.hidden_size, device=self.embedding.weight.device)


class TutorialLuongDecoder(nn.Module):
    """One step: GRU first, then dot attention of the new state over the encoder outputs."""

    def __init__(self, hidden_size: int, vocab_size: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, hidden_size)
        self.gru = nn.GRU(hidden_size, hidden_size)
        self.concat = nn.Linear(2 * hidden_size, hidden_size)
        self.out = nn.Linear(hidden_size, vocab_size)

    def forward(self, word: Tensor, hidden: Tensor, encoder_outputs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        embedded = F.relu(self.embedding(word).view(1, 1, -1))  # (1, 1, H)
        output, hidden = self.gru(embedded, hidden)  # (1, 1, H)
        query = output[0]  # (1, H)
        weights = F.softmax(query @ encoder_outputs.t(), dim=-1)  # (1, S)
        context = weights @ encoder_outputs  # (1, H)
        attentional = torch.tanh(self.concat(torch.cat([context, query], dim=1)))  # (1, H)
        return F.log_softmax(self.out(attentional), dim=1), hidden, weights  # (1, V)


def tutorial_train(source: Tensor, target: Tensor, encoder, decoder, encoder_optimizer, decoder_optimizer, criterion) -> float:
    """The tutorial's ``train()``: one pair, word-by-word encoder, teacher-forced decoder, one SGD step."""
    encoder_hidden = encoder.init_hidden()
    encoder_optimizer.zero_grad()
    decoder_optimizer.zero_grad()
    outputs = []
    for word in source:
        encoder_output, encoder_hidden = encoder(word, encoder_hidden)
        outputs.append(encoder_output[0, 0])
    encoder_outputs = torch.stack(outputs)  # (S, H)
    decoder_input = torch.tensor([[BOS]], device=target.device)
    decoder_hidden = encoder_hidden
    loss = 0
    for word in target:
        decoder_output, decoder_hidden, _ = decoder(decoder_input, decoder_hidden, encoder_outputs)
        loss = loss + criterion(decoder_output, word.view(1))
        decoder_input = word  # teacher forcing
    loss.backward()
    encoder_optimizer.step()
    decoder_optimizer.step()
    return loss.item() / target.shape[0]


@dataclass(frozen=True)
class Measurement:
    tokens: int
    seconds: float
    pairs: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def count_parameters(*modules: nn.Module) -> int:
    return sum(p.numel() for m in modules for p in m.parameters())


def bench_baseline(sources, targets, seed: int, warmup: int, timed: int, device: torch.device = torch.device("cpu")) -> tuple[Measurement, int]:
    torch.manual_seed(seed)
    encoder = TutorialEncoder(SOURCE_VOCAB, SIZE).to(device)
    decoder = TutorialLuongDecoder(SIZE, TARGET_VOCAB).to(device)
    encoder_optimizer = torch.optim.SGD(encoder.parameters(), lr=0.01)
    decoder_optimizer = torch.optim.SGD(decoder.parameters(), lr=0.01)
    criterion = nn.NLLLoss()
    rng = random.Random(seed + 1)
    chosen = [rng.randrange(len(sources)) for _ in range(warmup + timed)]
    # Like the tutorial's trainIters: tensors built before the loop, source and target ending in <eos>.
    tensors = [
        (torch.tensor(sources[i] + [EOS], device=device).view(-1, 1), torch.tensor(targets[i] + [EOS], device=device).view(-1, 1)) for i in chosen
    ]  # (S+1, 1), (T+1, 1)
    for source, target in tensors[:warmup]:
        tutorial_train(source, target, encoder, decoder, encoder_optimizer, decoder_optimizer, criterion)
    tokens = sum(target.shape[0] for _, target in tensors[warmup:])
    started = time.perf_counter()
    for source, target in tensors[warmup:]:
        tutorial_train(source, target, encoder, decoder, encoder_optimizer, decoder_optimizer, criterion)
    seconds = time.perf_counter() - started
    return Measurement(tokens, seconds, timed), count_parameters(encoder, decoder)


# -- attnkit -------------------------------------------------------------------------------------
def attnkit_config(seed: int, threads: int, device: torch.device = torch.device("cpu")) -> ExperimentConfig:
    return ExperimentConfig(
        name="train-speed",
        text_encoder=TextEncoderConfig(embedding_size=SIZE, hidden_size=SIZE, num_layers=1, rnn="gru", bidirectional=False, dropout=0.0),
        decoder=DecoderConfig(
            embedding_size=SIZE, hidden_size=SIZE, style="luong", score="dot", input_feeding=False, readout_size=SIZE, dropout=0.0
        ),
        train=TrainConfig(batch_size=BATCH_SIZE, device=str(device), precision="fp32", threads=threads, seed=seed),
    )


def synthetic_vocabulary(size: int, prefix: str) -> Vocabulary:
    return Vocabulary([*SPECIALS, *(f"{prefix}{i}" for i in range(size - len(SPECIALS)))])


def never_called(model: nn.Module) -> dict:
    raise AssertionError("the benchmark times train_epoch only; validation must not run")


def bench_attnkit(
    sources, targets, seed: int, threads: int, warmup_batches: int, epochs: int, fraction: float, run_dir: Path, device: torch.device = torch.device("cpu")
):
    config = attnkit_config(seed, threads, device)
    source_vocab, target_vocab = synthetic_vocabulary(SOURCE_VOCAB, "s"), synthetic_vocabulary(TARGET_VOCAB, "t")
    torch.manual_seed(seed)
    model = build_translation_model(config, source_vocab, target_vocab)
    objective = Seq2SeqObjective(pad_index=PAD)
    contents = CheckpointContents("translation", to_dict(config), {"source": source_vocab.to_list(), "target": target_vocab.to_list()})
    target_ids = [[BOS, *t, EOS] for t in targets]  # as TextPipeline.encode_pairs: source words only, target <bos> ... <eos>
    used = max(BATCH_SIZE, int(len(sources) * fraction))
    dataset = ParallelTextDataset(sources[:used], target_ids[:used])

    def trainer(data: ParallelTextDataset, folder: str) -> Trainer:
        return Trainer(model, objective, data, collate_pairs, never_called, config.train, run_dir / folder, contents, progress_bar=False)

    # Warm-up: the same model through the same path on a few batches' worth of pairs.
    warm = ParallelTextDataset(sources[: warmup_batches * BATCH_SIZE], target_ids[: warmup_batches * BATCH_SIZE])
    trainer(warm, "warmup").train_epoch(1)

    timed = trainer(dataset, "timed")
    tokens_per_epoch = sum(len(t) - 1 for t in dataset.target_ids)  # words + <eos>, as LossOutput.tokens
    runs, reported = [], []
    for epoch in range(1, epochs + 1):
        started = time.perf_counter()
        stats = timed.train_epoch(epoch)
        runs.append(Measurement(tokens_per_epoch, time.perf_counter() - started, len(dataset)))
        reported.append(stats["train_tokens_per_s"])
    return runs, reported, count_parameters(model), len(timed.batches), flops_per_token(model, objective, dataset)


def flops_per_token(model: nn.Module, objective: Seq2SeqObjective, dataset: ParallelTextDataset, batches: int = 8) -> float:
    """Matrix-multiply FLOPs of a forward + backward pass per target token, counted by PyTorch on a few batches.

    Tokens/s times this is the arithmetic rate the trainer sustains, to set against
    what the CPU's matrix multiplies reach: it says how much speed is left to gain.
    """
    sampler = BucketBatchSampler(dataset.lengths, BATCH_SIZE, seed=0)
    device = next(model.parameters()).device
    tokens = 0
    with FlopCounterMode(display=False) as counter:
        for _, indices in zip(range(batches), sampler):
            out = objective(model, collate_pairs([dataset[i] for i in indices]).to(device))
            out.loss().backward()
            tokens += int(out.tokens)
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / tokens


def matmul_gflops(seconds: float = 1.0, device: torch.device = torch.device("cpu")) -> float:
    """fp32 GFLOP/s of this CPU (or GPU) on the model's biggest matrix multiply (a batch of readouts times the output layer)."""
    readouts, weight = torch.randn(BATCH_SIZE * MAX_WORDS, SIZE, device=device), torch.randn(SIZE, TARGET_VOCAB, device=device)

    def work() -> None:
        readouts @ weight
        if device.type == "cuda":  # a GPU's product is only done once synchronised
            torch.cuda.synchronize(device)

    return best_rate(work, 2 * readouts.shape[0] * SIZE * TARGET_VOCAB / 1e9, seconds)


# -- report --------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict:
    args = get_args_parser().parse_args(argv)
    device = resolve_device(args.device)
    threads = args.threads or usable_cores()
    busy_before = busy_cores()
    torch.set_num_threads(threads)
    mode = "quick" if args.quick else "full"
    baseline_warmup, baseline_pairs = (10, 100) if args.quick else (20, 500)
    warmup_batches, epochs, fraction = (2, 1, 0.25) if args.quick else (3, 2, 1.0)

    sources, targets, origin = make_pairs(args.seed)
    print(f"train_speed ({mode}): torch {torch.__version__}, on {device}, {threads} thread(s), {processor_name()}, {usable_cores()} usable core(s)")
    if busy_before is not None and busy_before >= 0.25:
        print(f"note: other work kept {busy_before} core(s) busy just before the start; it slows both sides, unevenly (rerun when idle)")
    print(f"data: {PAIRS} random pairs, vocabulary {SOURCE_VOCAB}/{TARGET_VOCAB}, lengths from {origin}")

    with tempfile.TemporaryDirectory(prefix="attnkit-train-speed-") as folder:
        runs, reported, attnkit_params, batches, flops = bench_attnkit(
            sources, targets, args.seed, threads, warmup_batches, epochs, fraction, Path(folder), device
        )
    attnkit_tokens = sum(r.tokens for r in runs)
    attnkit_seconds = sum(r.seconds for r in runs)
    attnkit_rate = attnkit_tokens / attnkit_seconds
    print(
        f"attnkit : {attnkit_rate:10.1f} target tokens/s  ({epochs} epoch(s) of {runs[0].pairs} pairs = {batches} batches of <= {BATCH_SIZE}, "
        f"{attnkit_tokens} tokens in {attnkit_seconds:.2f} s; per epoch {', '.join(f'{r.tokens_per_s:.0f}' for r in runs)}; "
        f"Trainer's own figure {', '.join(f'{v:.0f}' for v in reported)})"
    )

    baseline, baseline_params = bench_baseline(sources, targets, args.seed, baseline_warmup, baseline_pairs, device)
    print(
        f"baseline: {baseline.tokens_per_s:10.1f} target tokens/s  ({baseline.pairs} pairs one at a time after {baseline_warmup} warm-up, "
        f"{baseline.tokens} tokens in {baseline.seconds:.2f} s)"
    )

    gflops, peak = attnkit_rate * flops / 1e9, matmul_gflops(device=device)
    print(
        f"compute : attnkit does {flops / 1e6:.2f} MFLOP of matrix multiplies (forward + backward) per target token: {gflops:.0f} GFLOP/s, "
        f"{gflops / peak:.0%} of the {peak:.0f} GFLOP/s this {'CPU' if device.type == 'cpu' else 'GPU'} reaches on one output-layer-sized matrix multiply"
    )
    ratio = attnkit_rate / baseline.tokens_per_s
    met = ratio >= TARGET_RATIO
    difference = (attnkit_params - baseline_params) / baseline_params
    print(f"params  : attnkit {attnkit_params:,}, baseline {baseline_params:,} ({difference:+.1%}: nearly equal; attnkit adds the decoder bridge)")
    print(f"ratio   : attnkit / baseline = {ratio:.1f}x (target >= {TARGET_RATIO:.0f}x: {'met' if met else 'NOT met'})")

    result = {
        "benchmark": "train_speed",
        "mode": mode,
        "device": str(device),
        "baseline_tokens_per_s": round(baseline.tokens_per_s, 1),
        "attnkit_tokens_per_s": round(attnkit_rate, 1),
        "ratio": round(ratio, 2),
        "target": TARGET_RATIO,
        "met": met,
        "params": {"baseline": baseline_params, "attnkit": attnkit_params},
        "baseline": {"pairs": baseline.pairs, "warmup_pairs": baseline_warmup, "tokens": baseline.tokens, "seconds": round(baseline.seconds, 3)},
        "attnkit": {
            "epochs": epochs,
            "pairs_per_epoch": runs[0].pairs,
            "batches_per_epoch": batches,
            "batch_size": BATCH_SIZE,
            "warmup_batches": warmup_batches,
            "tokens": attnkit_tokens,
            "seconds": round(attnkit_seconds, 3),
            "per_epoch_tokens_per_s": [round(r.tokens_per_s, 1) for r in runs],
            "trainer_reported_tokens_per_s": reported,
            "matmul_mflop_per_token": round(flops / 1e6, 3),
            "sustained_gflop_per_s": round(gflops, 1),
            "output_layer_matmul_gflop_per_s": round(peak, 1),
        },
        "data": {"pairs": PAIRS, "source_vocab": SOURCE_VOCAB, "target_vocab": TARGET_VOCAB, "max_words": MAX_WORDS, "lengths": origin},
        "seed": args.seed,
        "threads": threads,
    }
    print_result(result, busy_before)
    return result


if __name__ == "__main__":
    sys.exit(run_cli(lambda argv: main(argv) and 0))  # main returns its result; a UserError (--device) is one line, exit 2
