"""What a self-critical stage starts from: how peaked a cross-entropy captioner's own distribution is, and what its
samples score, on the training photos SCST samples from and on the validation photos.

    python bench/scst_start.py --checkpoint runs/bench-flickr8k/attention-seed0-XXXX/best.pt --photos 1000
    python bench/scst_start.py --checkpoint A/best.pt --checkpoint B/best.pt     # several starts, one table

SCST (``train.objective=scst``) moves probability towards the samples that score above the mean of their photo's
other samples, so what it can gain depends on its start's samples: their CIDEr-D (the first epoch's reward), how far
apart a photo's samples score (the signal: with the mean baseline the advantages are the deviations from it), and
how spread the distribution they come from is. For each checkpoint and split (the first ``--photos`` training
photos, all validation photos):

- ``greedy_cider_d``: the greedy captions (eval mode), as validation decodes;
- ``sample_cider_d``: ``--samples`` captions drawn per photo with the decoder's dropout on, as SCST draws them (its
  reward at step 0); ``sample_cider_d_eval``: drawn without dropout (the model's own distribution);
- ``within_photo_std``: the standard deviation of a photo's sampled rewards (dropout on), averaged over photos;
- ``nats_per_word``: the mean negative log-probability of the eval-mode samples' words, ``<eos>`` included: an
  estimate of the distribution's entropy per word (lower: more peaked);
- ``sample_length`` and ``greedy_length``: words per caption.

Each batch of photos is encoded once, in eval mode (with the recipes' ``image_encoder.dropout: 0`` the same as in
train mode: the backbone's batch norm keeps its statistics); only the decoder's dropout differs between the samplings.
CIDEr-D is on the validation printout's scale (x100), its document frequencies those of every photo of the split:
on the training split exactly SCST's reward, on validation the figure validation prints. Sampling is seeded
(``--seed``), so a rerun on the same machine repeats. Human-readable lines first; the LAST line of stdout is one
JSON object.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from attnkit.captioning import Captioner
from attnkit.checkpoint import load_checkpoint
from attnkit.cli import non_negative_int, positive_int
from attnkit.config import ExperimentConfig, from_dict
from attnkit.data.captions import image_root, read_caption_split
from attnkit.distributed import autocast, choose_threads
from attnkit.errors import UserError, run_cli
from attnkit.metrics import caption_words
from attnkit.search import greedy_search, sample
from attnkit.self_critical import cider_d_reward
from machine import add_device_argument, busy_cores, print_result, project_path


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", action="append", required=True, help="a captioning checkpoint (repeat for several)")
    parser.add_argument("--data", default="", help="prepared caption dataset (default: each checkpoint's data.path)")
    parser.add_argument("--photos", type=positive_int, default=1000, help="the first N training photos (default 1000)")
    parser.add_argument("--samples", type=positive_int, default=5, help="captions drawn per photo (SCST's train.scst_samples: 5)")
    parser.add_argument("--seed", type=int, default=0, help="the sampling's seed")
    parser.add_argument("--cache", default="cache/features", help="feature cache of the frozen backbone blocks ('' for none)")
    parser.add_argument("--threads", type=non_negative_int, default=0, help="torch CPU threads (0: the usable cores; 1 beside another job)")
    add_device_argument(parser)
    return parser


def measure(
    captioner: Captioner, images: list[Path], references: list[list[list[str]]], scored: int, samples: int, max_length: int, seed: int, batch: int = 32
) -> dict:
    """The figures above for the first ``scored`` of ``images``; CIDEr-D's document frequencies from all ``references``;
    ``max_length``: steps a caption may take, ``<eos>`` included (SCST's)."""
    reward = cider_d_reward(references)  # SCST's own reward function
    model, vocab = captioner.model, captioner.pipeline.vocab
    torch.manual_seed(seed)  # the dropout masks: each checkpoint's figures repeat whatever was measured before it
    # one stream of draws per mode, seeded alike: with no dropout in the decoder the two modes draw the same captions
    with_dropout_draws = torch.Generator(device=captioner.device).manual_seed(seed)
    eval_draws = torch.Generator(device=captioner.device).manual_seed(seed)
    greedy, drawn, drawn_eval, spreads, nats, words = [], [], [], [], 0.0, 0
    greedy_lengths, sample_lengths = [], []

    def as_words(tokens: list[int]) -> list[str]:
        return [vocab.words[i] for i in tokens]

    def scores(captions: list[list[int]], photos: list[int]) -> list[float]:
        return [100 * score for score in reward([as_words(caption) for caption in captions], photos)]

    for start in range(0, scored, batch):
        photos = list(range(start, min(start + batch, scored)))
        repeated = [photo for photo in photos for _ in range(samples)]
        with torch.no_grad(), autocast(captioner.device, captioner.precision):
            encoded = captioner.encode([images[photo] for photo in photos])  # eval mode, as validation encodes
            model.eval()
            found = greedy_search(model.decoder, encoded, vocab.bos_index, vocab.eos_index, max_length, never=vocab.never_output)
            model.decoder.train()  # dropout on, as SCST samples
            with_dropout = sample(model.decoder, encoded, vocab.bos_index, vocab.eos_index, vocab.pad_index, max_length, samples, vocab.never_output, with_dropout_draws)
            model.eval()
            without = sample(model.decoder, encoded, vocab.bos_index, vocab.eos_index, vocab.pad_index, max_length, samples, vocab.never_output, eval_draws)
        greedy += scores([h.tokens for h in found], photos)
        greedy_lengths += [len(caption_words(as_words(h.tokens))) for h in found]
        rewards = scores(with_dropout.words(vocab.eos_index), repeated)
        drawn += rewards
        spreads += [statistics.pstdev(rewards[i : i + samples]) for i in range(0, len(rewards), samples)]
        eval_words = without.words(vocab.eos_index)
        drawn_eval += scores(eval_words, repeated)
        sample_lengths += [len(caption_words(as_words(caption))) for caption in eval_words]
        is_word = without.is_word
        nats -= float((without.log_probs.float() * is_word).sum())
        words += int(is_word.sum())
    mean = statistics.fmean
    return {
        "photos": scored, "greedy_cider_d": round(mean(greedy), 2), "sample_cider_d": round(mean(drawn), 2),
        "sample_cider_d_eval": round(mean(drawn_eval), 2), "within_photo_std": round(mean(spreads), 2),
        "nats_per_word": round(nats / words, 3), "sample_length": round(mean(sample_lengths), 2), "greedy_length": round(mean(greedy_lengths), 2),
    }  # fmt: skip


def main(argv=None) -> int:
    args = get_args_parser().parse_args(argv)
    torch.set_num_threads(choose_threads(args.threads))
    busy = busy_cores()
    rows = []
    for path in args.checkpoint:
        checkpoint = load_checkpoint(path, task="captioning")
        captioner = Captioner.from_checkpoint(checkpoint, device=args.device, cache_dir=args.cache or None)
        config = from_dict(ExperimentConfig, checkpoint.config)
        folder = Path(args.data or config.data.path)
        root, tokenize = image_root(folder), captioner.pipeline.tokenizer.tokenize
        row = {"checkpoint": project_path(path)}
        for split in ("train", "valid"):
            items = read_caption_split(folder, split)
            scored = min(args.photos, len(items)) if split == "train" else len(items)
            if not scored:
                raise UserError(f"{folder} has no {split} photos")
            references = [[tokenize(r) for r in item.captions] for item in items]
            images = [root / item.image for item in items]
            row[split] = measure(captioner, images, references, scored, args.samples, config.data.max_target_length + 1, args.seed)
            figures = row[split]
            print(
                f"{path} {split} ({scored} photos): greedy CIDEr-D {figures['greedy_cider_d']}, sampled {figures['sample_cider_d']} "
                f"(dropout on; {figures['sample_cider_d_eval']} off), within a photo ± {figures['within_photo_std']}, "
                f"{figures['nats_per_word']} nats a word, lengths {figures['sample_length']} sampled / {figures['greedy_length']} greedy",
                flush=True,
            )
        rows.append(row)
    result = {"benchmark": "scst_start", "photos": args.photos, "samples": args.samples, "seed": args.seed, "rows": rows}
    return print_result(result, busy)


if __name__ == "__main__":
    sys.exit(run_cli(main))
