"""Beam search speed on CPU: sentences per second of attnkit's batched beam search, random weights at realistic sizes.

Run from the project root::

    python bench/beam_speed.py                                    # Multi30k-sized translation model, 256 sources, beam 5
    python bench/beam_speed.py --memory grid                      # the Flickr8k captioning decoder over 7x7 grids (49 cells)
    python bench/beam_speed.py --max-length 150 --eos-bias -10000  # long outputs: <eos> never wins, every sentence runs 150 steps
    python bench/beam_speed.py --sources 8 --repeats 1 --threads 1  # a smoke check (seconds)
    python bench/beam_speed.py --decoder transformer --max-length 40 --eos-bias -10000            # the Transformer, its key/value cache ...
    python bench/beam_speed.py --decoder transformer --max-length 40 --eos-bias -10000 --no-cache # ... against recomputing the prefix
    python bench/beam_speed.py --decoder transformer --eos-bias -10000 --precision bf16             # decoding a bf16 checkpoint

What is timed: ``beam_search`` over the sources in length-sorted batches of
``--batch-size`` (as ``Translator.translate`` decodes), ``--repeats`` times after a
short warm-up; the figure is the median. The encoder runs once beforehand and is
not timed. Weights are random, so what the model says does not matter, only how
long it searches. That is why the output reports the work done: the decoder steps
taken, the rows (hypotheses) they ran, the mean length of the best hypotheses and
how many ended with <eos>, and a digest of the best hypotheses' tokens.

``--eos-bias`` is added to the output layer's <eos> bias: very negative, no
hypothesis ends and every sentence runs to its length limit, which
``--max-length`` sets (default: the recipe's limit; 2 x source length + 10 for
translation, 30 for captions). A long limit is where a search whose steps cost
O(t) (copying the history so far) falls behind one whose steps cost O(1).

To compare two versions of the search, check that ``steps``, ``rows`` and
``outputs_digest`` agree, i.e. that both did the same work. A change of the
stopping rule changes the steps where a length penalty applies (``--alpha 0``
takes it out of the rule); a very negative ``--eos-bias`` runs every version to
the limit.

Sizes. ``text``: tasks/configs/multi30k_de_en.yaml (bi-GRU encoder 2 x 256,
embeddings 256; Luong GRU decoder 512, general attention, tied embeddings;
vocabularies of 7,865 German and 5,921 English words; length penalty 1.0), sources
of 6..18 random words (Multi30k's German test sentences average about 11 words
before tokenisation). ``grid``: tasks/configs/flickr8k.yaml's decoder (Bahdanau
LSTM 512, additive attention 512, beta gate; 1,757 words and the specials; no
length penalty) over random memories of ``--grid`` x ``--grid`` cells of 512.
``--decoder transformer``: tasks/configs/multi30k_de_en_transformer.yaml's sizes
(TRANSFORMER below: 3 + 3 layers, model size 256, 4 heads, feed-forward 1024, tied
target embeddings) with either memory; ``--no-cache`` decodes every step by running
the teacher-forced pass over the whole prefix again
(``attnkit.decoders.transformer.RecomputingDecoder``), which the key/value cache saves.

Human-readable lines first; the LAST line of stdout is one JSON object. Run it on
idle cores: the script says when it sees other work just before starting
(``busy_cores_before``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
import time

import torch
from torch import Tensor

from attnkit.config import DecoderConfig, SearchConfig, TextEncoderConfig
from attnkit.data.batching import pad_sequences
from attnkit.decoders import build_decoder
from attnkit.decoders.transformer import RecomputingDecoder
from attnkit.distributed import autocast, resolve_precision
from attnkit.encoders.text import build_text_encoder
from attnkit.errors import run_cli
from attnkit.interfaces import Decoder, DecoderState, EncoderOutput, Grid, StepOutput
from attnkit.search import Hypothesis, beam_search, max_steps
from attnkit.vocab import SPECIALS, Vocabulary
from machine import busy_cores, print_result

BOS, EOS = Vocabulary.bos_index, Vocabulary.eos_index
FIRST_WORD = len(SPECIALS)  # random word ids start after the specials
SOURCE_VOCAB, TARGET_VOCAB = 7865, 5921  # Multi30k de -> en, words seen at least twice
CAPTION_VOCAB = 1757 + len(SPECIALS)  # Flickr8k subset, words seen at least five times
SHORTEST, LONGEST = 6, 18
MEMORY_SIZE = 512
TEXT_SEARCH = SearchConfig(beam_size=5, length_penalty=1.0)  # multi30k_de_en.yaml (limit 2 x source + 10)
GRID_SEARCH = SearchConfig(beam_size=5, length_penalty=0.0, max_length_ratio=0.0, max_length_offset=30)  # flickr8k.yaml's when the figures were measured (its length penalty is 1 now: the ranking changes, not the work per step)
TRANSFORMER = dict(family="transformer", hidden_size=256, embedding_size=256, num_layers=3, heads=4, feedforward_size=1024, dropout=0.0)


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memory", choices=("text", "grid"), default="text", help="translation model over words, or captioning decoder over grids")
    parser.add_argument("--decoder", choices=("rnn", "transformer"), default="rnn", help="the recipe's RNN, or the Transformer recipe's sizes")
    parser.add_argument("--no-cache", action="store_true", help="transformer: recompute the prefix at every step instead of reading the key/value cache")
    parser.add_argument("--grid", type=int, default=7, help="grid side for --memory grid: 7 (49 cells) or 8 (64)")
    parser.add_argument("--sources", type=int, default=256, help="sentences (or images) to decode")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--alpha", type=float, default=None, help="length penalty (default: the recipe's, 1.0 for text, 0 for grid)")
    parser.add_argument("--max-length", type=int, default=0, help="output length limit in steps for every source (0: the recipe's limit)")
    parser.add_argument("--eos-bias", type=float, default=0.0, help="added to the <eos> output bias; very negative: no hypothesis ends")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes over all sources; the median is reported")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=1, help="seed of the weights and the sources")
    parser.add_argument(
        "--precision", choices=("fp32", "bf16"), default="fp32", help="the autocast the searches run under, as decoding a checkpoint of that train.precision does"
    )
    return parser


class CountingDecoder:
    """The decoder as search sees it (``init_state`` and ``step``), counting the steps taken and the rows they ran."""

    def __init__(self, decoder: Decoder):
        self.decoder, self.steps, self.rows = decoder, 0, 0

    def init_state(self, encoded: EncoderOutput) -> DecoderState:
        return self.decoder.init_state(encoded)

    def step(self, previous: Tensor, state: DecoderState) -> StepOutput:
        self.steps += 1
        self.rows += previous.shape[0]
        return self.decoder.step(previous, state)


def build(args: argparse.Namespace) -> tuple[Decoder, list[EncoderOutput], SearchConfig, str]:
    """The decoder, the encoded batches, the recipe's search settings and a description."""
    torch.manual_seed(args.seed)
    transformer = args.decoder == "transformer"
    if args.memory == "text":
        if transformer:
            encoder_settings = TextEncoderConfig(**TRANSFORMER)
            settings = DecoderConfig(**TRANSFORMER, tie_embeddings=True)
        else:
            encoder_settings = TextEncoderConfig(embedding_size=256, hidden_size=256, rnn="gru", bidirectional=True, dropout=0.0)
            settings = DecoderConfig(embedding_size=256, hidden_size=512, rnn="gru", style="luong", score="general", dropout=0.0, tie_embeddings=True)
        encoder = build_text_encoder(encoder_settings, SOURCE_VOCAB).eval()
        decoder = build_decoder(settings, TARGET_VOCAB, memory_size=encoder.output_size, init_size=encoder.init_size).eval()
        rng = random.Random(args.seed)
        sources = [[rng.randrange(FIRST_WORD, SOURCE_VOCAB) for _ in range(rng.randint(SHORTEST, LONGEST))] for _ in range(args.sources)]
        sources.sort(key=len)  # similar lengths together, as translation batches them
        with torch.no_grad():
            batches = [encoder(pad_sequences(sources[i : i + args.batch_size])) for i in range(0, len(sources), args.batch_size)]
        what = f"Multi30k-sized {args.decoder} translation model, sources of {SHORTEST}..{LONGEST} words, target vocabulary {TARGET_VOCAB}"
        search = TEXT_SEARCH
    else:
        if transformer:
            settings = DecoderConfig(**TRANSFORMER)
        else:
            settings = DecoderConfig(
                embedding_size=256, hidden_size=512, rnn="lstm", style="bahdanau", score="additive", attention_size=512, context_gate=True, dropout=0.0
            )
        decoder = build_decoder(settings, CAPTION_VOCAB, memory_size=MEMORY_SIZE, init_size=MEMORY_SIZE).eval()
        cells = args.grid * args.grid
        batches = []
        for start in range(0, args.sources, args.batch_size):
            memory = torch.randn(min(args.batch_size, args.sources - start), cells, MEMORY_SIZE)  # (B, L, D)
            mask = torch.ones(memory.shape[:2], dtype=torch.bool)  # (B, L) every cell is real
            batches.append(EncoderOutput(memory, mask, memory.mean(1), Grid(args.grid, args.grid)))
        what = f"Flickr8k-sized {args.decoder} captioning decoder over {args.grid}x{args.grid} grids of {MEMORY_SIZE}, vocabulary {CAPTION_VOCAB}"
        search = GRID_SEARCH
    with torch.no_grad():
        decoder.output.bias[EOS] += args.eos_bias
    if args.no_cache:
        decoder = RecomputingDecoder(decoder)
    return decoder, batches, search, what


def decode(
    decoder: CountingDecoder, batches: list[EncoderOutput], beam: int, alpha: float, max_length: int, search: SearchConfig
) -> tuple[list[Hypothesis], float]:
    """The best hypothesis of every source and the seconds the searches took."""
    best = []
    started = time.perf_counter()
    for encoded in batches:
        limits = max_length or max_steps(encoded, search.max_length_ratio, search.max_length_offset)
        best += [h[0] for h in beam_search(decoder, encoded, BOS, EOS, beam, limits, alpha)]
    return best, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = get_args_parser()
    args = parser.parse_args(argv)
    if min(args.grid, args.sources, args.batch_size, args.beam, args.repeats, args.threads) < 1 or args.max_length < 0:
        parser.error("--grid, --sources, --batch-size, --beam, --repeats and --threads must be at least 1, --max-length at least 0")
    if args.no_cache and args.decoder != "transformer":
        parser.error("--no-cache applies to --decoder transformer (an RNN carries its state, not a cache)")
    torch.set_num_threads(args.threads)
    busy_before = busy_cores()
    decoder, batches, search, what = build(args)
    alpha = search.length_penalty if args.alpha is None else args.alpha
    limit = f"{args.max_length} steps" if args.max_length else f"{search.max_length_ratio:g} x source length + {search.max_length_offset}"
    print(f"beam_speed: {what}")
    print(f"{args.sources} sources in batches of {args.batch_size}, beam {args.beam}, alpha {alpha:g}, limit {limit}, <eos> bias {args.eos_bias:+g}")
    print(f"torch threads {torch.get_num_threads()}, precision {args.precision}")
    if busy_before is not None and busy_before >= 0.25:
        print(f"note: other work kept {busy_before} core(s) busy just before the start; rerun on idle cores")

    with torch.no_grad(), autocast(torch.device("cpu"), resolve_precision(args.precision)):  # as Translator and Captioner decode
        decode(CountingDecoder(decoder), [batches[0]], args.beam, alpha, args.max_length, search)  # warm-up
        seconds, digests = [], set()
        for repeat in range(args.repeats):
            counting = CountingDecoder(decoder)
            best, elapsed = decode(counting, batches, args.beam, alpha, args.max_length, search)
            seconds.append(elapsed)
            digests.add(hashlib.sha256(json.dumps([h.tokens for h in best]).encode()).hexdigest()[:16])
            print(f"pass {repeat + 1}: {args.sources / elapsed:8.1f} sentences/s  ({elapsed:.2f} s, {counting.steps} steps)")
    median = statistics.median(seconds)
    rate = args.sources / median
    mean_length = sum(len(h.tokens) for h in best) / len(best)
    finished = sum(h.finished for h in best)
    print(f"median   : {rate:8.1f} sentences/s  ({median:.2f} s); {counting.steps} decoder steps over {counting.rows} rows")
    print(f"outputs  : mean length {mean_length:.1f} words, {finished}/{len(best)} ended with <eos>")
    result = {
        "benchmark": "beam_speed",
        "memory": args.memory,
        "decoder": args.decoder,
        "cache": args.decoder == "transformer" and not args.no_cache,
        "grid": args.grid if args.memory == "grid" else None,
        "sources": args.sources,
        "batch_size": args.batch_size,
        "beam_size": args.beam,
        "alpha": alpha,
        "max_length": args.max_length or None,
        "eos_bias": args.eos_bias,
        "sentences_per_s": round(rate, 2),
        "seconds": [round(s, 3) for s in seconds],
        "median_seconds": round(median, 3),
        "steps": counting.steps,
        "rows": counting.rows,
        "mean_length": round(mean_length, 2),
        "finished": finished,
        "outputs_digest": sorted(digests)[0] if len(digests) == 1 else sorted(digests),
        "precision": args.precision,
        "threads": args.threads,
        "seed": args.seed,
    }
    return print_result(result, busy_before)


if __name__ == "__main__":
    sys.exit(run_cli(main))
