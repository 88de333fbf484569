"""Peer race: attnkit against Joey NMT 2.3.0 on Multi30k de->en, same data, model size and machine.

Run from the project root, on an otherwise idle machine::

    python bench/peers.py                 # full: 30 minutes of training each, back to back (about 75 minutes)
    python bench/peers.py --quick         # 600 training pairs, 1 minute each: a smoke check of the whole path
    python bench/peers.py --minutes 45 --threads 2
    python bench/peers.py --recipe tasks/configs/multi30k_de_en_transformer_words.yaml   # Transformer against Joey's Transformer
    python bench/peers.py --device cuda   # both on a GPU (default: the CPU; see "On a GPU" below)

What it does, in one run of the script:

1. Prepares ``data/multi30k-de-en`` when missing (``data_scripts/prepare_multi30k.py``; raw text,
   test = test_2016_flickr).
2. Makes Joey NMT's own virtual environment when missing: ``.peers/joeynmt/venv`` (git-ignored;
   Joey is never a dependency of attnkit): ``python -m venv`` with attnkit's interpreter (so the same
   torch wheel fits), then ``pip install torch==2.14.1 joeynmt==2.3.0 importlib_metadata`` (Joey
   imports ``importlib_metadata`` without declaring it). ``--joey-venv`` (or ``$ATTNKIT_JOEY_VENV``) uses another one.
3. Trains attnkit: ``attnkit train`` with the recipe (``tasks/configs/multi30k_de_en.yaml``) and
   ``train.max_minutes=--minutes``, then scores ``best.pt`` on the test split with
   ``attnkit evaluate --beam 5``.
4. Trains Joey NMT on the same sentences, tokenised by attnkit's own tokenizer (Moses, lower-cased:
   Joey reads them as ``level: word`` split on spaces, with ``voc_min_freq`` and ``max_length`` as
   the recipe's), with a config built from the same recipe (:func:`joey_config`). Joey has no time
   budget option, so it gets the recipe's epochs and is stopped by SIGINT when ``--minutes`` have
   passed since its log said ``EPOCH 1`` (Joey catches KeyboardInterrupt, saves its weights and
   exits); its ``best.ckpt`` (best validation BLEU, as attnkit's ``best.pt``) decodes the test split
   with beam 5, alpha 1.0. Joey gets the test sources only: the references stay with this script.
5. Scores both test outputs the same way: Joey's tokenised output is detokenised by attnkit's Moses
   detokeniser, then both go through ``attnkit.metrics.translation_scores(..., lowercase=True)``
   against the raw references (sacreBLEU 13a, lower-cased, as the recipe is).

Fairness rules:

* One system at a time (attnkit first, then Joey), each in a fresh process, with the same torch CPU
  thread count (``--threads``; attnkit ``train.threads``, Joey ``torch.set_num_threads`` in its
  launcher, both with ``OMP_NUM_THREADS``), on the same device (the CPU unless ``--device`` says otherwise),
  with the same torch version (both are reported).
* The same training budget in wall-clock minutes: it counts training and validation, not the setup
  before the first epoch (reading data, building vocabularies) nor the test decoding. attnkit starts
  no epoch that would end past it; Joey is interrupted at it. Both validate once per epoch (greedy
  decoding, BLEU), which picks the tested checkpoint and drives the learning-rate schedule.
* Speed = target tokens per second of training, each system's own figure: attnkit's
  ``train_tokens_per_s`` in ``log.jsonl`` (one per epoch), Joey's ``Tokens per Sec`` lines in its
  ``train.log`` (logged once per epoch here: ``logging_freq`` = the steps of one epoch). Both count
  the same tokens: the non-padding positions of the target shifted by one, i.e. the target words
  plus ``<eos>``, without ``<bos>`` and without padding (attnkit: ``LossOutput.tokens`` =
  ``(target[:, 1:] != pad).sum()`` in ``attnkit/model.py``; Joey 2.3.0: ``batch.ntokens`` =
  ``(trg[:, 1:] != pad).sum()`` in ``joeynmt/batch.py``, trg = ``<s>`` words ``</s>``). Both time the
  epoch's batch loop (data loading included, validation excluded). Every epoch sees the same tokens,
  so the run's figure is the harmonic mean of the per-epoch figures (= all tokens / all seconds).
  Only completed epochs count; Joey's interrupted last epoch has no figure.

The same model, as far as Joey allows (``differences`` in the JSON says where not); the RNN recipe's: bi-GRU encoder
256 per direction over 256-wide embeddings, GRU decoder 512 initialised by tanh(W h_enc), Luong
``general`` attention after the RNN, no input feeding, attentional vector tanh(W_c [h; c]), dropout
0.3, label smoothing 0.1, Adam 1e-3, gradient norm clipped at 1.0, loss averaged over target tokens,
batches of 64 sentences, pairs over 50 words left out of training, words seen fewer than 2 times
mapped to ``<unk>``, the rate halved after 1 validation without improvement, beam 5 with GNMT length
penalty alpha 1.0. What differs:

* attnkit ties the output layer to the 256-wide target embeddings through a 256-wide readout; Joey
  can tie only when the embeddings are as wide as the decoder (512), so its attentional vector is 512
  wide and its output layer a separate matrix: more parameters and a larger softmax matmul.
* Joey appends ``</s>`` to every source sentence; attnkit encodes the words only.
* Dropout after the readout (attnkit) vs on [h; c] before it (Joey's ``hidden_dropout``).
* Batches: attnkit groups sentences of similar length; Joey 2.3.0 draws random batches (more padding).
* The schedule: Joey 2.3.0's ``plateau`` scheduler fails on torch 2.14 (it passes
  ``ReduceLROnPlateau(verbose=False)``, an argument torch no longer takes). The other schedulers do
  not mirror attnkit's: 2.3.0 refuses a config without ``scheduling``; ``exponential`` with
  ``decrease_factor: 1.0`` is a constant rate (which would cost Joey BLEU, and the comparison its
  fairness); ``decaying`` ignores ``decaying_step_size`` in 2.3.0 and divides the rate by 10 every
  epoch. So Joey keeps ``plateau`` and runs through a small launcher (:data:`JOEY_LAUNCHER`, written
  beside its config as run_joey.py) that builds that scheduler without the argument (its value was
  the default anyway) and sets the thread count. Joey's plateau compares scores with an absolute
  threshold of 0, attnkit's with PyTorch's relative 1e-4.
* Stopping: attnkit's recipe stops early after 4 validations without improvement; Joey stops only at
  the budget (or when its rate falls below ``learning_rate_min``, set to attnkit's ``min_lr``).
* Validation BLEU: attnkit scores detokenised output against raw references, Joey its tokenised
  output against tokenised references (and computes a validation loss too).
* Label smoothing spreads 0.1 over every word but ``<pad>`` and ``<bos>`` (attnkit) or every word but
  ``<pad>`` and the gold one (Joey). Initialisation: PyTorch defaults vs Joey's Xavier. Decoding
  stops at 2 x source length + 10 (attnkit) or 1.5 x the batch's longest source (Joey); attnkit cuts
  test sources at 50 words, Joey reads them whole.

The Transformer race (issue 18; ``--recipe tasks/configs/multi30k_de_en_transformer_words.yaml``, the
Transformer recipe's model on the same lower-cased Moses words): 3 + 3 pre-norm layers of model size 256,
4 heads, feed-forward 1024, sinusoidal positions, embeddings x sqrt(256), dropout 0.2 (embeddings after
the positions, sublayer outputs, attention weights, the feed-forward's inner layer), the output layer
tied to the target embeddings, label smoothing 0.1, Adam with the rate warmed up linearly to 7e-4 over
1,000 steps, batches of 64 sentences. Joey's Transformer is built from the same recipe
(:func:`joey_transformer_model`); what differs is listed by :func:`differences`, chiefly the schedule
after the warm-up: attnkit halves the rate on validation plateaus, Joey (which has no warm-up followed by
plateaus) takes its own Transformer schedule, warmupinversesquareroot, with the same warm-up and peak.

On a GPU (``--device cuda``, ``cuda:N`` or ``auto``; a CUDA device that is not there is one error before
anything runs): attnkit trains with ``train.device`` set to it and decodes with ``attnkit evaluate --device``.
Joey's config gets ``use_cuda: true`` (at the top, where Joey 2.3.0 reads it, and in ``training``); Joey
takes no GPU index (its device is plain ``cuda`` and it counts every visible GPU), so its processes see only
the chosen one (``CUDA_VISIBLE_DEVICES``). Joey's ``fp16`` stays false: it trains in fp32 at PyTorch's default
matmul precision, while attnkit trains at the recipe's ``train.precision`` (auto: fp32)
and its fp32 uses TF32 matmuls, so the speeds are not at equal precision (``--set train.precision=fp32``
comes closest). The thread count still applies to both. The JSON's ``device`` says where the race ran.

Targets (issues 12 and 18): attnkit >= 1.5x Joey's target tokens/s, and attnkit's test BLEU >= Joey's.
Human-readable lines first; the LAST line of stdout is one JSON object. The run folder (``--out``)
keeps both runs: ``attnkit/`` (checkpoints, log.jsonl, test output; its console log beside it) and
``joeynmt/`` (tokenised data, config.yaml, run_joey.py, model/ with Joey's train.log and checkpoints,
console logs, test output ``hyps.test``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from attnkit.config import DecoderConfig, ExperimentConfig, TextEncoderConfig, TrainConfig, load_config
from attnkit.data.text import read_parallel, write_parallel_dataset
from attnkit.distributed import resolve_device, usable_cores
from attnkit.errors import UserError, run_cli
from attnkit.metrics import translation_scores
from attnkit.model import count_parameters
from attnkit.translation import Translator
from attnkit.vocab import Tokenizer
from machine import add_device_argument, busy_cores, print_result, project_path
from multi30k import ensure_dataset  # prepares data/multi30k-de-en when missing, as the quality benchmark does

ROOT = Path(__file__).resolve().parents[1]

SOURCE, TARGET = "de", "en"
RECIPE = ROOT / "tasks/configs/multi30k_de_en.yaml"
JOEY_VERSION = "2.3.0"
JOEY_TORCH = "2.14.1"  # the torch the race runs on, in both environments
JOEY_PACKAGES = (f"torch=={JOEY_TORCH}", f"joeynmt=={JOEY_VERSION}", "importlib_metadata")
JOEY_VENV = Path(os.environ.get("ATTNKIT_JOEY_VENV") or ROOT / ".peers/joeynmt/venv")  # git-ignored; the env var points elsewhere
FULL_MINUTES = 30.0
QUICK_MINUTES = 1.0
QUICK = {"train": 600, "valid": 100, "test": 100}  # pairs per split in --quick mode
TARGET_SPEED_RATIO = 1.5  # attnkit tokens/s over Joey's
JOEY_SETUP_SECONDS = 20 * 60  # Joey's data loading before its first epoch; longer means something is wrong
JOEY_STOP_SECONDS = 10 * 60  # from SIGINT to exit: Joey saves one checkpoint
JOEY_SPLITS = {"train": "train", "valid": "dev", "test": "test"}  # attnkit split -> Joey's file prefix
TOKENS_COUNTED = "target words + <eos>; no <bos>, no padding (both systems)"

# -- the keys Joey 2.3.0 reads -------------------------------------------------------------------------
# Joey's constructors end in **kwargs and its config is a plain dict, so a misspelt key is silently
# ignored. These are the keys its code reads for a recurrent or Transformer word-level model (joeynmt/config.py
# parse_global_args / parse_train_args / parse_test_args, __main__.py, data.py, tokenizers.py
# _build_tokenizer, vocabulary.py _build_vocab, model.py build_model, encoders.py RecurrentEncoder and
# TransformerEncoder, decoders.py RecurrentDecoder and TransformerDecoder, embeddings.py Embeddings,
# initialization.py initialize_model). Not listed: emb_dropout, which build_model sets from the embeddings'
# dropout and passes beside the section's keys (written in the section too, it would be passed twice).
# Not listed on purpose: decaying_step_size, learning_rate_decay, learning_rate_peak, momentum ...:
# builders.py looks them up in the parsed TrainConfig, which never holds them (read, but never set).
_JOEY_SIDE = {
    "lang", "level", "lowercase", "normalize", "max_length", "min_length", "voc_file", "voc_min_freq", "voc_limit", "tokenizer_type",
    "tokenizer_cfg", "has_prompt",
}  # fmt: skip
_JOEY_EMBEDDINGS = {"embedding_dim", "scale", "freeze", "dropout", "load_pretrained"}
JOEY_READS: dict[str, set[str]] = {
    "": {"name", "joeynmt_version", "model_dir", "use_cuda", "num_workers", "fp16", "random_seed", "data", "training", "testing", "model"},
    "data": {"train", "dev", "test", "src", "trg", "dataset_type", "dataset_cfg", "sample_train_subset", "sample_dev_subset", "special_symbols"},
    "data.src": _JOEY_SIDE,
    "data.trg": _JOEY_SIDE,
    "data.src.tokenizer_cfg": {"pretokenizer"},
    "data.trg.tokenizer_cfg": {"pretokenizer"},
    "training": {
        "load_model", "load_encoder", "load_decoder", "loss", "normalization", "label_smoothing", "optimizer", "adam_betas",
        "learning_rate", "learning_rate_min", "learning_rate_factor", "learning_rate_warmup", "scheduling", "patience",
        "decrease_factor", "weight_decay", "clip_grad_norm", "clip_grad_val", "keep_best_ckpts", "logging_freq",
        "validation_freq", "print_valid_sents", "early_stopping_metric", "shuffle", "epochs", "updates", "batch_size",
        "batch_type", "batch_multiplier", "reset_best_ckpt", "reset_scheduler", "reset_optimizer", "reset_iter_state",
        "overwrite", "use_cuda", "num_workers",
    },  # fmt: skip
    "testing": {
        "load_model", "batch_size", "batch_type", "max_output_length", "min_output_length", "eval_metrics", "sacrebleu_cfg",
        "beam_size", "beam_alpha", "n_best", "return_attention", "return_prob", "generate_unk", "repetition_penalty",
        "no_repeat_ngram_size",
    },  # fmt: skip
    "testing.sacrebleu_cfg": {"tokenize", "lowercase"},
    "model": {
        "encoder", "decoder", "tied_embeddings", "tied_softmax", "initializer", "init_gain", "init_weight", "embed_initializer",
        "embed_init_weight", "embed_init_gain", "bias_initializer", "bias_init_weight", "init_rnn_orthogonal", "lstm_forget_gate",
    },  # fmt: skip
    "model.encoder": {
        "type", "rnn_type", "embeddings", "hidden_size", "num_layers", "dropout", "bidirectional", "freeze",
        "ff_size", "num_heads", "layer_norm", "alpha", "activation",  # the transformer's (encoders.py TransformerEncoder)
    },  # fmt: skip
    "model.decoder": {
        "type", "rnn_type", "embeddings", "hidden_size", "num_layers", "dropout", "hidden_dropout", "attention", "init_hidden",
        "input_feeding", "freeze", "activation",
        "ff_size", "num_heads", "layer_norm", "alpha",  # the transformer's (decoders.py TransformerDecoder)
    },  # fmt: skip
    "model.encoder.embeddings": _JOEY_EMBEDDINGS,
    "model.decoder.embeddings": _JOEY_EMBEDDINGS,
}
# Keys Joey indexes without a default (a KeyError when missing), or whose default would build another model.
JOEY_REQUIRES = (
    "name", "model_dir", "data.src.lang", "data.src.level", "data.trg.lang", "data.trg.level", "training.batch_size",
    "testing", "model.encoder.type", "model.encoder.embeddings.embedding_dim", "model.decoder.type",
    "model.decoder.embeddings.embedding_dim",
)  # fmt: skip
# ... and those of each model type. A Transformer's layer_norm must be written out: its layers default
# to "pre" in the encoder and "post" in the decoder, and the final LayerNorm exists only when it says "pre".
JOEY_REQUIRES_BY_TYPE = {
    "recurrent": ("model.decoder.attention",),
    "transformer": (
        "model.encoder.num_heads", "model.encoder.ff_size", "model.encoder.layer_norm",
        "model.decoder.num_heads", "model.decoder.ff_size", "model.decoder.layer_norm",
    ),
}  # fmt: skip

# How attnkit's Luong-style decoder scores map onto Joey's RNN-first decoder (its only structure).
JOEY_ATTENTION = {"general": "luong", "additive": "bahdanau"}

# Joey NMT's command line with the two changes the race needs; written beside Joey's config as
# run_joey.py and run by the Joey environment's Python (it cannot import attnkit).
JOEY_LAUNCHER = '''"""Joey NMT's command line (python -m joeynmt), run by attnkit's bench/peers.py with two additions.

    python run_joey.py THREADS {train,test,translate} CONFIG [joeynmt options]

1. torch.set_num_threads(THREADS) before Joey starts: Joey never sets a thread count itself.
2. Joey 2.3.0 builds its "plateau" scheduler as ReduceLROnPlateau(..., verbose=False); torch 2.14
   no longer takes ``verbose``. Where torch refuses it, the scheduler is built without it (False was
   the default anyway, so the schedule is Joey's own).
"""

import inspect
import sys

import torch
from torch.optim import lr_scheduler


def patch_plateau() -> bool:
    """Let joeynmt.builders build ReduceLROnPlateau on a torch without ``verbose``; True when it had to."""
    import joeynmt.builders

    if "verbose" in inspect.signature(lr_scheduler.ReduceLROnPlateau.__init__).parameters:
        return False

    class ReduceLROnPlateau(lr_scheduler.ReduceLROnPlateau):
        def __init__(self, *args, verbose=False, **kwargs):
            super().__init__(*args, **kwargs)

    joeynmt.builders.ReduceLROnPlateau = ReduceLROnPlateau
    return True


if __name__ == "__main__":
    torch.set_num_threads(int(sys.argv[1]))
    patch_plateau()
    from joeynmt.__main__ import main

    sys.argv = ["joeynmt", *sys.argv[2:]]
    main()
'''


# -- the Joey config ---------------------------------------------------------------------------------------
def check_joey_can_express(recipe: ExperimentConfig) -> None:
    """A clear error for a recipe Joey's models cannot mirror (e.g. after ``--set``)."""
    encoder, decoder, train = recipe.text_encoder, recipe.decoder, recipe.train
    problems = []
    if recipe.task != "translation":
        problems.append(f"task is {recipe.task}, not translation")
    if recipe.data.tokenizer.kind == Tokenizer.SUBWORDS:
        problems.append("data.tokenizer.kind is sentencepiece; the race feeds Joey attnkit's words (moses, nltk or space)")
    if train.teacher_forcing < 1 or train.attention_regularization > 0 or train.attention_supervision > 0:
        problems.append("train.teacher_forcing < 1, attention_regularization or attention_supervision is set; Joey has none of them")
    if encoder.family != decoder.family:
        problems.append(f"text_encoder.family is {encoder.family} and decoder.family {decoder.family}; the race mirrors one family at a time")
    elif decoder.family == "transformer":
        if encoder.positions != "sinusoidal":
            problems.append(f"text_encoder.positions is {encoder.positions}; Joey's Transformer has sinusoidal positions only")
        if encoder.hidden_size != decoder.hidden_size:
            problems.append(
                f"text_encoder.hidden_size {encoder.hidden_size} differs from decoder.hidden_size {decoder.hidden_size}; "
                "Joey's cross-attention reads a memory of the decoder's size"
            )
    else:
        if encoder.rnn not in ("gru", "lstm"):
            problems.append(f"text_encoder.rnn is {encoder.rnn}; Joey's recurrent encoder is a GRU or an LSTM")
        if decoder.style != "luong":
            problems.append(f"decoder.style is {decoder.style}; Joey's recurrent decoder runs the RNN before attending (luong)")
        if decoder.score not in JOEY_ATTENTION:
            problems.append(f"decoder.score is {decoder.score}; Joey has {' and '.join(JOEY_ATTENTION)} only")
        if decoder.init != "bridge":
            problems.append(f"decoder.init is {decoder.init}; the race uses Joey's bridge (tanh(W h_enc))")
    if problems:
        raise UserError("Joey NMT cannot mirror this recipe: " + "; ".join(problems))


def joey_embeddings(size: int, dropout: float, scaled: bool) -> dict[str, Any]:
    """Joey's embeddings section; ``scaled``: multiplied by sqrt(size) when read, as a Transformer's are."""
    return {"embedding_dim": size, "scale": scaled, "dropout": dropout}


def joey_recurrent_model(recipe: ExperimentConfig) -> dict[str, Any]:
    encoder, decoder = recipe.text_encoder, recipe.decoder
    return {
        "tied_embeddings": False,  # the vocabularies differ
        "tied_softmax": False,  # Joey ties only when embedding_dim == decoder hidden_size (see differences)
        "encoder": {
            "type": "recurrent",
            "rnn_type": encoder.rnn,
            "embeddings": joey_embeddings(encoder.embedding_size, encoder.dropout, scaled=False),
            "hidden_size": encoder.hidden_size,
            "num_layers": encoder.num_layers,
            "bidirectional": encoder.bidirectional,
            "dropout": encoder.dropout,  # between layers (Joey applies it only with 2+)
        },
        "decoder": {
            "type": "recurrent",  # Joey's default decoder is a Transformer
            "rnn_type": decoder.rnn,
            "embeddings": joey_embeddings(decoder.embedding_size, decoder.dropout, scaled=False),
            "hidden_size": decoder.hidden_size,
            "num_layers": decoder.num_layers,
            "attention": JOEY_ATTENTION[decoder.score],
            "input_feeding": decoder.input_feeding,
            "init_hidden": "bridge",
            "hidden_dropout": decoder.dropout,  # on [h; c]; attnkit drops after the readout
            "dropout": decoder.dropout,  # between layers
        },
    }


def joey_transformer_model(recipe: ExperimentConfig) -> dict[str, Any]:
    """Joey's Transformer of the recipe's sizes: pre-norm layers ending in a LayerNorm, as attnkit.blocks builds them."""

    def stack(section: TextEncoderConfig | DecoderConfig) -> dict[str, Any]:
        return {
            "type": "transformer",
            "embeddings": joey_embeddings(section.embedding_size, section.dropout, scaled=True),  # its dropout: after adding positions
            "hidden_size": section.hidden_size,
            "ff_size": section.feedforward_size,
            "num_layers": section.num_layers,
            "num_heads": section.heads,
            "dropout": section.dropout,  # on each sublayer's output, the attention weights and the feed-forward's inner layer
            "layer_norm": "pre",
            "activation": "relu",  # Joey's default, written out: attnkit's feed-forward layer
        }

    return {
        "tied_embeddings": False,  # source and target vocabularies differ
        "tied_softmax": recipe.decoder.tie_embeddings,  # the output layer is the target embeddings (embedding_dim == hidden_size)
        "encoder": stack(recipe.text_encoder),
        "decoder": stack(recipe.decoder),
    }


def joey_schedule(train: TrainConfig) -> dict[str, Any]:
    """Joey's learning-rate schedule nearest to attnkit's (attnkit.optim).

    Without a warm-up both halve the rate after ``lr_patience`` validations without gain (Joey's plateau,
    through run_joey.py). Joey has no warm-up followed by plateaus; with one, it gets its own Transformer
    schedule with the same linear warm-up to the same peak, then the peak x sqrt(warm-up / step).
    """
    # learning_rate_min: with the plateau Joey stops below it (attnkit keeps training at it); after a warm-up it is a floor.
    if train.warmup_steps == 0:
        return {"scheduling": "plateau", "patience": train.lr_patience, "decrease_factor": train.lr_factor, "learning_rate_min": train.min_lr}
    return {"scheduling": "warmupinversesquareroot", "learning_rate_warmup": train.warmup_steps, "learning_rate_min": train.min_lr}


def joey_config(
    recipe: ExperimentConfig,
    data_dir: Path,
    model_dir: Path,
    steps_per_epoch: int,
    source_lang: str = SOURCE,
    target_lang: str = TARGET,
    device: torch.device = torch.device("cpu"),
) -> dict[str, Any]:
    """Joey NMT 2.3.0's config for the recipe's model and training, on the word files in ``data_dir``.

    ``steps_per_epoch``: Joey validates and logs its tokens/s once per epoch, as attnkit does.
    ``device``: a CUDA device sets ``use_cuda`` (which GPU: :func:`thread_environment`); ``fp16`` stays false.
    """
    check_joey_can_express(recipe)
    data, train, search = recipe.data, recipe.train, recipe.search

    def side(lang: str, max_length: int) -> dict[str, Any]:
        # The files hold attnkit's tokens, lower-cased already: Joey only splits them on spaces.
        return {
            "lang": lang, "level": "word", "lowercase": False, "normalize": False, "max_length": max_length,
            "voc_min_freq": data.min_freq, **({"voc_limit": data.max_vocab} if data.max_vocab else {}),
            "tokenizer_cfg": {"pretokenizer": "none"},
        }  # fmt: skip

    training = {
        "optimizer": "adam",
        "adam_betas": [0.9, 0.999],  # torch's defaults, as attnkit's Adam
        "learning_rate": train.lr,  # the peak, after a warm-up
        "weight_decay": train.weight_decay,
        **joey_schedule(train),
        "loss": "crossentropy",
        "label_smoothing": train.label_smoothing,
        "normalization": "tokens",  # summed token loss / target tokens, as attnkit's mean token loss
        "batch_size": train.batch_size,
        "batch_type": "sentence",
        "batch_multiplier": 1,
        "epochs": train.epochs,  # the budget's SIGINT usually comes first
        "early_stopping_metric": "bleu",  # picks best.ckpt (and drives a plateau schedule), as attnkit's validation BLEU
        "validation_freq": steps_per_epoch,
        "logging_freq": steps_per_epoch,  # one "Tokens per Sec" line per epoch, like attnkit's log.jsonl
        "keep_best_ckpts": 1,
        "shuffle": True,
        "overwrite": True,  # Joey empties model_dir itself; it is a folder of its own
        "use_cuda": device.type == "cuda",
        "num_workers": 0,  # as attnkit's loader on CPU
    }
    if train.clip_norm > 0:
        training["clip_grad_norm"] = train.clip_norm
    model = joey_transformer_model(recipe) if recipe.decoder.family == "transformer" else joey_recurrent_model(recipe)
    return {
        "name": f"{recipe.name}_joeynmt",
        "joeynmt_version": JOEY_VERSION,
        "model_dir": str(model_dir),
        "use_cuda": device.type == "cuda",
        "fp16": False,
        "random_seed": train.seed,
        "data": {
            "train": str(data_dir / JOEY_SPLITS["train"]),
            "dev": str(data_dir / JOEY_SPLITS["valid"]),
            "test": str(data_dir / JOEY_SPLITS["test"]),
            "dataset_type": "plain",
            "src": side(source_lang, data.max_source_length),
            "trg": side(target_lang, data.max_target_length),
        },
        "training": training,
        "testing": {
            "eval_metrics": ["bleu"],
            "sacrebleu_cfg": {"tokenize": "13a"},
            "batch_size": 128,  # validation decodes batches of 128 in attnkit too
            "batch_type": "sentence",
            "beam_size": search.beam_size,  # validation is greedy whatever this says (set_validation_args)
            "beam_alpha": search.length_penalty,  # the same GNMT penalty ((5 + len) / 6) ** alpha
            "n_best": 1,
            "generate_unk": True,  # <unk> stays in the output, as in attnkit's (no unk replacement)
        },
        "model": {
            "initializer": "xavier_uniform",  # Joey's defaults, written out
            "embed_initializer": "xavier_uniform",
            "bias_initializer": "zeros",
            **model,
        },
    }


def joey_test_config(config: Mapping[str, Any], checkpoint: Path) -> dict[str, Any]:
    """The training config for ``joeynmt test``: the test split only (no dev decoding), from ``checkpoint``."""
    test = json.loads(json.dumps(config))  # a deep copy of plain data
    del test["data"]["dev"]
    test["testing"]["load_model"] = str(checkpoint)
    return test


def unread_joey_keys(config: Mapping[str, Any], where: str = "") -> list[str]:
    """Dotted keys of ``config`` that Joey 2.3.0 never reads (see :data:`JOEY_READS`)."""
    unread = []
    for key, value in config.items():
        dotted = f"{where}.{key}" if where else key
        if key not in JOEY_READS[where]:
            unread.append(dotted)
        elif isinstance(value, Mapping) and dotted in JOEY_READS:
            unread += unread_joey_keys(value, dotted)
    return unread


def missing_joey_keys(config: Mapping[str, Any]) -> list[str]:
    def present(dotted: str) -> bool:
        node: Any = config
        for part in dotted.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return False
            node = node[part]
        return True

    model_type = config.get("model", {}).get("decoder", {}).get("type")
    return [key for key in (*JOEY_REQUIRES, *JOEY_REQUIRES_BY_TYPE.get(model_type, ())) if not present(key)]


def check_joey_config(config: Mapping[str, Any]) -> None:
    """A config Joey would misread is a bug of this script: fail before anything runs."""
    unread, missing = unread_joey_keys(config), missing_joey_keys(config)
    if unread or missing:
        raise ValueError(f"Joey config: keys Joey 2.3.0 never reads: {unread}; keys it needs: {missing}")


# -- the data Joey reads -------------------------------------------------------------------------------
# Joey reads its files with str.splitlines() (which also breaks lines at these) and splits a line into
# words at " " only; tokens never hold them in practice, but one would shift every later line.
_LINE_BREAKS = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def joey_line(tokens: Sequence[str]) -> str:
    """attnkit's tokens as one line that Joey splits back into the same tokens."""
    cleaned = (_LINE_BREAKS.sub("", token).replace(" ", "") for token in tokens)
    return " ".join(token for token in cleaned if token)


def write_lines(path: Path, lines: Sequence[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


@dataclass(frozen=True)
class JoeyData:
    folder: Path
    lines: dict[str, int]  # lines written per Joey split (train, dev; test: its sources only)
    left_out_empty: dict[str, int]  # train/dev pairs left out: a side tokenises to nothing (Joey would drop the line alone)
    trained_pairs: int  # training pairs Joey keeps: both sides 1..max_length words, as attnkit keeps
    target_tokens_per_epoch: int  # their target words + one <eos> each: what both systems count in an epoch
    steps_per_epoch: int  # batches of one epoch (Joey does not drop the last, short one)
    long_test_sources: int  # test sources over max_source_length words: attnkit cuts them, Joey reads them whole


def write_joey_data(
    splits: Mapping[str, Sequence[tuple[str, str]]], folder: Path, recipe: ExperimentConfig, source_lang: str = SOURCE, target_lang: str = TARGET
) -> JoeyData:
    """Tokenise the raw ``splits`` (train / valid / test) with the recipe's own tokenizer (attnkit's
    :class:`~attnkit.vocab.Tokenizer`: Moses, lower-cased) and write Joey's space-joined word files."""
    source, target = Tokenizer(recipe.data.tokenizer, source_lang), Tokenizer(recipe.data.tokenizer, target_lang)
    max_source, max_target = recipe.data.max_source_length, recipe.data.max_target_length
    folder.mkdir(parents=True, exist_ok=True)
    written, left_out = {}, {}
    trained = target_tokens = long_test = 0
    for split, pairs in splits.items():
        name = JOEY_SPLITS[split]
        if split == "test":
            # Sources only: the references stay with this script, which scores both systems. (Joey drops empty
            # lines from each file, so an empty reference would also pull its test set out of step.)
            sources = [joey_line(source.tokenize(s)) for s, _ in pairs]
            empty = [i + 1 for i, line in enumerate(sources) if not line]
            if empty:
                raise UserError(f"test source line(s) {empty[:5]} tokenise to nothing; Joey cannot decode them in step with the references")
            long_test = sum(len(line.split(" ")) > max_source for line in sources)
            write_lines(folder / f"{name}.{source_lang}", sources)
            (folder / f"{name}.{target_lang}").unlink(missing_ok=True)  # with a reference file Joey would score the test set itself
            written[name] = len(sources)
            continue
        lines = [(joey_line(source.tokenize(s)), joey_line(target.tokenize(t))) for s, t in pairs]
        kept = [(s, t) for s, t in lines if s and t]  # attnkit leaves these out of training too
        left_out[name] = len(lines) - len(kept)
        if split == "train":
            within = [t for s, t in kept if len(s.split(" ")) <= max_source and len(t.split(" ")) <= max_target]
            trained, target_tokens = len(within), sum(len(t.split(" ")) + 1 for t in within)
        write_lines(folder / f"{name}.{source_lang}", [s for s, _ in kept])
        write_lines(folder / f"{name}.{target_lang}", [t for _, t in kept])
        written[name] = len(kept)
    if trained == 0:
        raise UserError("no training pair is within the recipe's length limits: nothing to train on")
    steps = math.ceil(trained / recipe.train.batch_size)
    return JoeyData(folder, written, left_out, trained, target_tokens, steps, long_test)


def read_output(path: Path, sentences: int, what: str) -> list[str]:
    """The lines of a test output file, which must hold one per test sentence."""
    if not path.is_file():
        raise UserError(f"{what} wrote no test output ({path} is missing)")
    lines = path.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) != sentences:
        raise UserError(f"{what} wrote {len(lines)} test translations for {sentences} sentences ({path})")
    return lines


def detokenise_joey_output(lines: Sequence[str], detokenizer: Tokenizer) -> list[str]:
    """Joey's test output (tokens joined by spaces) as text, detokenised by attnkit's detokeniser."""
    return [detokenizer.detokenize([word for word in line.split(" ") if word]) for line in lines]


# -- Joey's log ------------------------------------------------------------------------------------------
_JOEY_RATE = re.compile(r"Epoch\s+(\d+), Step:\s+(\d+), Batch Loss:.*Tokens per Sec:\s+([0-9.]+), Lr: ([0-9.eE+-]+)")
_JOEY_EPOCH = re.compile(r"Epoch\s+(\d+), total training loss: [0-9.eE+-]+, num\. of seqs: (\d+), num\. of tokens: (\d+), ([0-9.]+)\[sec\]")
_JOEY_INTERRUPT = re.compile(r"Interrupt at epoch (\d+), step (\d+)\.")
_JOEY_VALID = re.compile(r"Evaluation result \(greedy\): bleu:\s+([0-9.]+)")
_JOEY_PARAMS = re.compile(r"Total params: (\d+)")
_JOEY_VOCAB = re.compile(r"Number of unique (Src|Trg) tokens \(vocab_size\): (\d+)")
_JOEY_FIRST_EPOCH = re.compile(r" - EPOCH 1\s*$", re.MULTILINE)


@dataclass(frozen=True)
class JoeyLog:
    """What Joey's train.log says about a run."""

    tokens_per_s: list[float] = field(default_factory=list)  # its "Tokens per Sec" lines (one per epoch here)
    epochs: list[dict[str, float]] = field(default_factory=list)  # end-of-epoch lines: epoch, sentences, tokens, seconds
    steps: int = 0
    interrupted: dict[str, int] | None = None  # {"epoch", "step"} of the SIGINT
    valid_bleu: list[float] = field(default_factory=list)
    parameters: int | None = None
    vocabulary: dict[str, int] = field(default_factory=dict)  # source / target vocabulary sizes


def parse_joey_log(text: str) -> JoeyLog:
    rates, epochs, valid, steps = [], [], [], 0
    for line in text.splitlines():
        if match := _JOEY_RATE.search(line):
            rates.append(float(match[3]))
            steps = max(steps, int(match[2]))
        elif match := _JOEY_EPOCH.search(line):
            epochs.append({"epoch": int(match[1]), "sentences": int(match[2]), "tokens": int(match[3]), "seconds": float(match[4])})
        elif match := _JOEY_VALID.search(line):
            valid.append(float(match[1]))
    interrupt = _JOEY_INTERRUPT.search(text)
    interrupted = {"epoch": int(interrupt[1]), "step": int(interrupt[2])} if interrupt else None
    if interrupted:
        steps = max(steps, interrupted["step"])
    params = _JOEY_PARAMS.search(text)
    vocabulary = {"source" if side == "Src" else "target": int(size) for side, size in _JOEY_VOCAB.findall(text)}
    return JoeyLog(rates, epochs, steps, interrupted, valid, int(params[1]) if params else None, vocabulary)


def overall_rate(per_epoch: Sequence[float]) -> float | None:
    """The run's tokens/s from per-epoch figures of epochs with equal tokens: their harmonic mean."""
    rates = [rate for rate in per_epoch if rate > 0]
    return round(len(rates) / sum(1.0 / rate for rate in rates), 1) if rates else None


# -- running the two systems -------------------------------------------------------------------------------
def thread_environment(threads: int, joey: bool = False, device: torch.device | None = None) -> dict[str, str]:
    """This process's environment with ``threads`` OpenMP/MKL threads; for Joey's Python also without
    what points into attnkit's environment, and, on a CUDA ``device``, with only that GPU visible (Joey
    takes no GPU index: it uses ``cuda``, and every visible GPU)."""
    env = {key: value for key, value in os.environ.items() if not (joey and key in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"))}
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    if joey and device is not None and device.type == "cuda":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")  # cuda:N counts among these where set
        index = device.index or 0
        env["CUDA_VISIBLE_DEVICES"] = visible.split(",")[index].strip() if visible else str(index)
    return env


def last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1].strip()[:300] if lines else ""


def run_logged(command: Sequence[str], log: Path, env: Mapping[str, str], what: str) -> None:
    """Run ``command`` to the end with its output in ``log``; a failure is one line naming the log."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w", encoding="utf-8") as out:
        code = subprocess.run(list(command), stdout=out, stderr=subprocess.STDOUT, env=dict(env), cwd=ROOT).returncode
    if code != 0:
        raise UserError(f"{what} failed (exit {code}): {last_line(log)} (log: {log})")


def venv_versions(python: Path) -> dict[str, str] | None:
    """joeynmt and torch versions installed in the environment of ``python``; None when either is missing."""
    if not python.is_file():
        return None
    probe = "import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in ('joeynmt', 'torch', 'importlib_metadata')}))"
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, env=thread_environment(1, joey=True))
    return json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 and done.stdout.strip() else None


def ensure_joey_venv(venv: Path) -> dict[str, str]:
    """Joey NMT's own environment at ``venv`` (made when missing or incomplete); its package versions."""
    python = venv / "bin" / "python"
    versions = venv_versions(python)
    if versions and versions["joeynmt"] == JOEY_VERSION and versions["torch"].split("+")[0] == JOEY_TORCH:
        return versions
    log = venv.parent / "pip.log"
    if not python.is_file():
        print(f"making Joey NMT's environment {venv} (once; git ignores .peers/)")
        # attnkit's interpreter: the same Python version, so the same torch wheel as attnkit's installs.
        run_logged([sys.executable, "-m", "venv", str(venv)], log, thread_environment(1), f"python -m venv {venv}")
    print(f"installing {' '.join(JOEY_PACKAGES)} into {venv} with pip (log: {log})")
    run_logged([str(python), "-m", "pip", "install", *JOEY_PACKAGES], log, thread_environment(1, joey=True), "installing Joey NMT")
    versions = venv_versions(python)
    if not versions or versions["joeynmt"] != JOEY_VERSION:
        raise UserError(f"{venv} still has no joeynmt {JOEY_VERSION} after pip install (log: {log})")
    return versions


@dataclass(frozen=True)
class JoeyTraining:
    seconds: float  # from the "EPOCH 1" line to the end (SIGINT or exit)
    interrupted: bool  # stopped by the budget (else it ended by itself: its epochs, or its minimum rate)
    exit_code: int


def _default_sigint() -> None:
    """In the child before it runs: SIGINT back to its default action.

    A benchmark started in the background (``nohup ... &``) inherits SIGINT ignored, and a Python
    started with SIGINT ignored never raises KeyboardInterrupt: Joey would not hear the budget's end.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_joey_training(command: Sequence[str], train_log: Path, budget_seconds: float, console: Path, env: Mapping[str, str]) -> JoeyTraining:
    """Start Joey's training; from the line ``EPOCH 1`` of ``train_log`` on, give it ``budget_seconds``, then SIGINT.

    Joey has no time budget of its own; it catches KeyboardInterrupt, saves its weights and exits.
    """
    console.parent.mkdir(parents=True, exist_ok=True)
    with console.open("w", encoding="utf-8") as out:
        process = subprocess.Popen(list(command), stdout=out, stderr=subprocess.STDOUT, env=dict(env), cwd=ROOT, preexec_fn=_default_sigint)
    try:
        launched = time.monotonic()
        while not (train_log.is_file() and _JOEY_FIRST_EPOCH.search(train_log.read_text(encoding="utf-8", errors="replace"))):
            if process.poll() is not None:
                raise UserError(f"Joey NMT stopped before its first epoch (exit {process.returncode}): {last_line(console)} (log: {console})")
            if time.monotonic() - launched > JOEY_SETUP_SECONDS:
                raise UserError(f"Joey NMT did not start training within {JOEY_SETUP_SECONDS // 60} minutes (log: {console})")
            time.sleep(0.5)
        started = time.monotonic()
        while process.poll() is None and time.monotonic() - started < budget_seconds:
            time.sleep(min(1.0, max(0.05, budget_seconds - (time.monotonic() - started))))
        interrupted = process.poll() is None
        if interrupted:
            process.send_signal(signal.SIGINT)
        stopped = time.monotonic()
        try:
            code = process.wait(timeout=JOEY_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            raise UserError(f"Joey NMT did not exit within {JOEY_STOP_SECONDS // 60} minutes of SIGINT (log: {console})") from None
        if not interrupted:
            stopped = time.monotonic()  # it ended by itself, at most a poll interval ago
        if code != 0:
            raise UserError(f"Joey NMT's training failed (exit {code}): {last_line(console)} (log: {console})")
        return JoeyTraining(round(stopped - started, 1), interrupted, code)
    finally:
        if process.poll() is None:  # our own error or Ctrl-C: do not leave it running
            process.kill()
            process.wait()


_ATTNKIT_PAIRS = re.compile(r"(\d+) training pairs \(of (\d+)\)")  # translation.py's note at the start of training


def read_attnkit_log(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise UserError(f"attnkit's training wrote no log ({path} is missing)")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def race_attnkit(args: argparse.Namespace, dataset: Path, out: Path, test_pairs: list[tuple[str, str]], recipe: ExperimentConfig) -> dict[str, Any]:
    run_dir = out / "attnkit"
    sets = [*args.overrides, f"output_dir={run_dir}", f"data.path={dataset}", f"train.max_minutes={args.minutes}", f"train.threads={args.threads}", f"train.device={args.device}"]
    env = thread_environment(args.threads)
    console = run_dir.parent / "attnkit.console.log"  # beside the run folder: --overwrite would not keep it inside
    busy = busy_cores()
    print(f"attnkit: training {args.minutes:g} min on {args.threads} thread(s) (log: {project_path(str(console))})")
    train = [sys.executable, str(ROOT / "tasks/train.py"), "--config", str(Path(args.recipe).resolve()), "--overwrite", "--no-progress"]
    run_logged(train + [item for value in sets for item in ("--set", value)], console, env, "attnkit's training")
    log = read_attnkit_log(run_dir / "log.jsonl")
    pairs = _ATTNKIT_PAIRS.search(console.read_text(encoding="utf-8", errors="replace"))
    beam = recipe.search.beam_size
    output = run_dir / f"test.beam{beam}.{TARGET}"
    evaluate = [sys.executable, str(ROOT / "tasks/evaluate.py"), "--checkpoint", str(run_dir / "best.pt"), "--split", "test", "--data", str(dataset)]
    evaluate += ["--beam", str(beam), "--device", str(args.device), "--output", str(output)]
    print(f"attnkit: decoding the test split with beam {beam}")
    run_logged(evaluate, run_dir / "evaluate.log", env, "attnkit's test decoding")
    hypotheses = read_output(output, len(test_pairs), "attnkit")
    translator = Translator.from_checkpoint(run_dir / "best.pt", device=str(args.device))
    rates = [record["train_tokens_per_s"] for record in log]
    best = [record for record in log if record["best"]][-1]  # what best.pt holds (a tie keeps the later epoch)
    return {
        "tokens_per_s": overall_rate(rates),
        "per_epoch_tokens_per_s": rates,
        "epochs": len(log),
        "steps": log[-1]["step"],
        "train_minutes": round(sum(record["epoch_seconds"] for record in log) / 60, 2),
        "stop_reason": log[-1].get("stop", "all epochs"),
        "training_pairs": int(pairs[1]) if pairs else None,
        "best_epoch": best["epoch"],
        "best_valid_bleu": best["valid"]["bleu"],
        "test": score(hypotheses, test_pairs, recipe),
        "checkpoint": "best.pt",
        "parameters": count_parameters(translator.model),
        "vocabulary": {"source": len(translator.pipeline.source_vocab), "target": len(translator.pipeline.target_vocab)},
        "busy_cores_before": busy,
        "run_dir": project_path(str(run_dir)),
    }


@dataclass(frozen=True)
class JoeyRun:
    """Joey's side of the race, written out before anything trains (so a data or config problem shows at once)."""

    folder: Path  # the run folder's joeynmt/
    model_dir: Path  # Joey's model_dir: Joey empties it when it starts
    data: JoeyData
    config: dict[str, Any]
    config_path: Path
    launcher: Path


def prepare_joey(splits: Mapping[str, list[tuple[str, str]]], out: Path, recipe: ExperimentConfig, device: torch.device = torch.device("cpu")) -> JoeyRun:
    folder = out / "joeynmt"
    model_dir = folder / "model"
    if model_dir.exists() and not (model_dir / "train.log").is_file():
        raise UserError(f"{model_dir} exists and holds no Joey NMT run; Joey would empty it: move it or pick another --out")
    shutil.rmtree(model_dir, ignore_errors=True)  # a previous race's train.log must not be read as this one's
    print("joeynmt: writing the attnkit-tokenised data and the config")
    data = write_joey_data(splits, folder / "data", recipe)
    config = joey_config(recipe, data.folder, model_dir, data.steps_per_epoch, device=device)
    check_joey_config(config)
    config_path = folder / "config.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    launcher = folder / "run_joey.py"
    launcher.write_text(JOEY_LAUNCHER, encoding="utf-8")
    return JoeyRun(folder, model_dir, data, config, config_path, launcher)


def race_joey(
    args: argparse.Namespace, run: JoeyRun, test_pairs: list[tuple[str, str]], recipe: ExperimentConfig, versions: dict[str, str]
) -> dict[str, Any]:
    folder, model_dir, data = run.folder, run.model_dir, run.data
    python = str(args.joey_venv / "bin" / "python")
    env = thread_environment(args.threads, joey=True, device=args.device)
    busy = busy_cores()
    console = folder / "train.console.log"
    print(f"joeynmt: training {args.minutes:g} min on {args.threads} thread(s) (log: {project_path(str(model_dir / 'train.log'))})")
    training = run_joey_training(
        [python, str(run.launcher), str(args.threads), "train", str(run.config_path), "--skip-test"], model_dir / "train.log", args.minutes * 60, console, env
    )
    log = parse_joey_log((model_dir / "train.log").read_text(encoding="utf-8", errors="replace"))
    # best.ckpt is the best validation BLEU, as attnkit's best.pt; a run stopped before its first validation has only its last weights.
    checkpoint = model_dir / "best.ckpt" if (model_dir / "best.ckpt").exists() else model_dir / "latest.ckpt"
    test_config = folder / "config.test.yaml"
    test_config.write_text(yaml.safe_dump(joey_test_config(run.config, checkpoint), sort_keys=False), encoding="utf-8")
    print(f"joeynmt: decoding the test split with beam {recipe.search.beam_size} ({checkpoint.name})")
    decode = [python, str(run.launcher), str(args.threads), "test", str(test_config), "--output-path", str(folder / "hyps")]
    run_logged(decode, folder / "test.console.log", env, "Joey NMT's test decoding")
    tokenised = read_output(folder / "hyps.test", len(test_pairs), "Joey NMT")
    hypotheses = detokenise_joey_output(tokenised, Tokenizer(recipe.data.tokenizer, TARGET))
    epoch_tokens = sum(epoch["tokens"] for epoch in log.epochs)
    epoch_seconds = sum(epoch["seconds"] for epoch in log.epochs)
    return {
        "tokens_per_s": overall_rate(log.tokens_per_s),
        "per_epoch_tokens_per_s": log.tokens_per_s,
        "tokens_per_s_from_epoch_lines": round(epoch_tokens / epoch_seconds, 1) if epoch_seconds > 0 else None,  # a cross-check
        "epochs": len(log.epochs),
        "steps": log.steps,
        "training_pairs": data.trained_pairs,
        "epoch_lines": log.epochs,  # Joey's own count per epoch: its tokens should be data.target_tokens_per_epoch
        "train_minutes": round(training.seconds / 60, 2),
        "stop_reason": "time budget (SIGINT)" if training.interrupted else "ended by itself",
        "interrupted_at": log.interrupted,
        "best_valid_bleu": max(log.valid_bleu) if log.valid_bleu else None,
        "validations": len(log.valid_bleu),
        "test": score(hypotheses, test_pairs, recipe),
        "checkpoint": checkpoint.name,
        "parameters": log.parameters,
        "vocabulary": log.vocabulary,
        "data": asdict(data) | {"folder": project_path(str(data.folder))},
        "versions": versions | {"attnkit_torch": torch.__version__},
        "busy_cores_before": busy,
        "run_dir": project_path(str(folder)),
    }


def score(hypotheses: Sequence[str], pairs: Sequence[tuple[str, str]], recipe: ExperimentConfig) -> dict[str, Any]:
    """The one scoring both systems get: detokenised output against the raw references."""
    scores = translation_scores(list(hypotheses), [[reference] for _, reference in pairs], lowercase=recipe.data.tokenizer.lowercase)
    keys = ("bleu", "bleu_cased", "bleu_lowercased", "chrf", "bleu_signature")
    return {key: scores[key] for key in keys}


def differences(recipe: ExperimentConfig, attnkit: Mapping[str, Any] | None = None, joey: Mapping[str, Any] | None = None) -> list[str]:
    """Where Joey's model and training differ from attnkit's (see the module docstring)."""
    decoder, train = recipe.decoder, recipe.train
    found = []
    if train.decay_epochs:  # Joey has no schedule that falls to 0 over a run's last epochs
        found.append(f"schedule: attnkit's rate falls linearly to 0 over the last {train.decay_epochs} of {train.epochs} epochs (train.decay_epochs); Joey's does not")
    if decoder.family == "transformer":
        if decoder.tie_embeddings:
            found.append("output layer: both are the target embeddings; attnkit's has a bias and drops its input out, Joey's has neither")
        if train.warmup_steps:
            found.append(
                f"schedule: both warm the rate up linearly to {train.lr:g} over {train.warmup_steps} steps; then attnkit halves it after "
                f"{train.lr_patience} validations without BLEU gain, Joey (which has no warm-up followed by plateaus) multiplies it by "
                f"sqrt({train.warmup_steps} / step) (its warmupinversesquareroot, floored at {train.min_lr:g})"
            )
        found.append("initialisation: Xavier-uniform layers in both; embeddings N(0, 1/size) in attnkit, Xavier-uniform in Joey (both read x sqrt(size))")
        found.append("LayerNorm epsilon: 1e-5 (PyTorch's) in attnkit, 1e-6 in Joey")
    else:
        if decoder.tie_embeddings:
            found.append(
                f"output layer: attnkit ties it to the {decoder.embedding_size}-wide target embeddings through a {decoder.embedding_size}-wide "
                f"readout tanh(W_c[h; c]); Joey ties only when embedding_dim == decoder hidden_size, so its readout is "
                f"{decoder.hidden_size} wide and its output layer a separate V x {decoder.hidden_size} matrix without bias"
            )
        elif decoder.readout_size not in (0, decoder.hidden_size):
            found.append(f"readout: attnkit's is {decoder.readout_size} wide, Joey's attentional vector is always the decoder's {decoder.hidden_size}")
        found += [
            "dropout: both drop source and target embeddings; attnkit drops the readout before the output layer, Joey [h; c] before its readout (hidden_dropout)",
            "schedule: both halve the rate after a validation without BLEU gain; Joey's plateau runs through run_joey.py's torch-2.14 shim "
            "(threshold absolute 0) and stops below learning_rate_min; attnkit's (relative 1e-4) floors at min_lr",
            "initialisation: attnkit PyTorch's defaults, Joey Xavier-uniform weights and embeddings, zero biases",
        ]
    found += [
        "source: Joey appends </s> to every source sentence (one more encoder step and attention position); attnkit encodes the words only",
        f"batches: attnkit groups sentences of similar length (bucketed, less padding); Joey 2.3.0 draws random batches of {train.batch_size}",
        "stopping: attnkit stops early after train.patience validations without gain and starts no epoch that would overrun the budget; "
        "Joey is interrupted at the budget (its last, partial epoch is never validated)",
        "validation BLEU (picks the tested checkpoint): attnkit on detokenised output vs raw references, Joey on tokenised output vs tokenised references",
        "label smoothing: attnkit spreads it over every word but <pad> and <bos>, Joey over every word but <pad> and the gold word",
        "decoding limit: attnkit 2 x source length + 10 per sentence, Joey 1.5 x the longest source of the batch",
    ]
    if joey is not None and joey["data"]["long_test_sources"]:
        found.append(f"{joey['data']['long_test_sources']} test source(s) over {recipe.data.max_source_length} words: attnkit cuts them, Joey reads them whole")
    if attnkit is not None and joey is not None and joey.get("parameters"):
        found.append(f"parameters: attnkit {attnkit['parameters']:,}, Joey {joey['parameters']:,}")
    return found


# -- the script ---------------------------------------------------------------------------------------------
def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=None, help=f"training budget of each system (default {FULL_MINUTES:g}; --quick {QUICK_MINUTES:g})")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads of both systems (default: the usable cores)")
    add_device_argument(parser)
    quick = f"{QUICK['train']} training pairs, {QUICK['valid']} valid, {QUICK['test']} test, {QUICK_MINUTES:g} minute each"
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--recipe", default=str(RECIPE), help="attnkit recipe both systems are configured from")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="recipe override; both systems follow it (output_dir, data.path, train.max_minutes, train.threads and train.device are the script's)",
    )  # fmt: skip
    parser.add_argument("--dataset", type=Path, default=ROOT / "data" / f"multi30k-{SOURCE}-{TARGET}", help="prepared Multi30k de-en folder (made when missing)")
    parser.add_argument("--data", default="", help="data root holding multi30k/, to prepare --dataset (default $ATTNKIT_DATA, else ../shared/data)")
    parser.add_argument("--joey-venv", type=Path, default=JOEY_VENV, help="Joey NMT's virtual environment (made when missing)")
    parser.add_argument(
        "--out", type=Path, default=None, help="run folder (default runs/bench-peers, -quick with --quick, -transformer for a Transformer recipe)"
    )
    return parser


def check_arguments(args: argparse.Namespace) -> None:
    args.device = resolve_device(args.device)  # a CUDA that is not there: one error before anything else
    if args.minutes is None:
        args.minutes = QUICK_MINUTES if args.quick else FULL_MINUTES
    if not (args.minutes > 0 and math.isfinite(args.minutes)):
        raise UserError(f"--minutes must be more than 0, got {args.minutes:g}")
    if args.threads < 0:
        raise UserError(f"--threads must be at least 1 (or 0: the usable cores), got {args.threads}")
    args.threads = args.threads or usable_cores()


def default_out(recipe: ExperimentConfig, quick: bool) -> Path:
    """runs/bench-peers[-transformer][-quick]: a Transformer race does not overwrite the RNN race's folder."""
    family = "-transformer" if recipe.decoder.family == "transformer" else ""
    return ROOT / "runs" / f"bench-peers{family}{'-quick' if quick else ''}"


def read_splits(dataset: Path, quick: bool) -> dict[str, list[tuple[str, str]]]:
    splits = {split: read_parallel(dataset, split, SOURCE, TARGET) for split in JOEY_SPLITS}
    if quick:
        splits = {split: pairs[: QUICK[split]] for split, pairs in splits.items()}
    for split, pairs in splits.items():
        if not pairs:
            raise UserError(f"{dataset}: the {split} split is empty")
    return splits


def same_data(attnkit: Mapping[str, Any], joey: Mapping[str, Any]) -> dict[str, bool]:
    """Did both train on the same pairs, and did Joey count the tokens attnkit counts (words + <eos>) in every epoch?"""
    expected = joey["data"]["target_tokens_per_epoch"]
    return {
        "training_pairs": attnkit["training_pairs"] == joey["training_pairs"],
        "joey_tokens_per_epoch": all(epoch["tokens"] == expected for epoch in joey["epoch_lines"]),
        "joey_sentences_per_epoch": all(epoch["sentences"] == joey["training_pairs"] for epoch in joey["epoch_lines"]),
    }


def verdict(met: bool | None) -> str:
    return "not measured" if met is None else ("met" if met else "NOT met")


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    check_arguments(args)
    recipe = load_config(args.recipe, args.overrides)
    check_joey_can_express(recipe)
    mode = "quick" if args.quick else "full"
    out = (args.out or default_out(recipe, args.quick)).resolve()
    ensure_dataset(args.dataset, args.data)
    splits = read_splits(args.dataset, args.quick)
    dataset = args.dataset.resolve()
    if args.quick:  # attnkit trains on the same slice, as a dataset folder of its own
        dataset = write_parallel_dataset(out / "data-quick", (SOURCE, TARGET), splits, {"name": "multi30k-de-en-peers-quick", "subset_of": str(args.dataset)})
    joey_run = prepare_joey(splits, out, recipe, args.device)  # before any install or training: a data problem shows at once
    args.joey_venv = args.joey_venv.resolve()
    versions = ensure_joey_venv(args.joey_venv)
    if versions["torch"].split("+")[0] != torch.__version__.split("+")[0]:  # package metadata may leave out the build label
        print(f"note: Joey's environment has torch {versions['torch']}, attnkit's {torch.__version__}: the race is not on equal terms")

    busy_before = busy_cores()
    print(f"peers ({mode}): attnkit vs Joey NMT {JOEY_VERSION} on Multi30k {SOURCE}->{TARGET}, {args.minutes:g} min of training each, {args.threads} thread(s), {args.device}")
    if busy_before is not None and busy_before >= 0.25:
        print(f"note: other work kept {busy_before} core(s) busy just before the start; both figures will be slower than on an idle machine")
    attnkit = race_attnkit(args, dataset, out, splits["test"], recipe)
    joey = race_joey(args, joey_run, splits["test"], recipe, versions)

    ratio = round(attnkit["tokens_per_s"] / joey["tokens_per_s"], 2) if attnkit["tokens_per_s"] and joey["tokens_per_s"] else None
    speed_met = None if ratio is None else ratio >= TARGET_SPEED_RATIO
    bleu_met = attnkit["test"]["bleu"] >= joey["test"]["bleu"]
    beam = recipe.search.beam_size
    for name, side in (("attnkit", attnkit), ("joeynmt", joey)):
        rate = f"{side['tokens_per_s']:,.0f} target tok/s" if side["tokens_per_s"] else "no complete epoch, so no tok/s"
        print(
            f"{name:8}: {side['epochs']} epoch(s), {side['steps']:,} steps in {side['train_minutes']:.1f} min ({side['stop_reason']}); "
            f"{rate}; test BLEU {side['test']['bleu']} (beam {beam}, {side['checkpoint']})"
        )
    print(f"speed attnkit/Joey: {ratio}x (target >= {TARGET_SPEED_RATIO}x: {verdict(speed_met)})")
    print(f"BLEU attnkit {attnkit['test']['bleu']} vs Joey {joey['test']['bleu']} (target attnkit >= Joey: {verdict(bleu_met)})")
    print(f"tokens counted: {TOKENS_COUNTED}; scoring: {attnkit['test']['bleu_signature']}")
    same = same_data(attnkit, joey)
    if not all(same.values()):
        print(f"note: the two did not train on the same pairs or tokens: {same}")
    result = {
        "benchmark": "peers",
        "mode": mode,
        "pair": f"{SOURCE}-{TARGET}",
        "test_split": "test_2016_flickr",
        "test_sentences": len(splits["test"]),
        "minutes": args.minutes,
        "threads": args.threads,
        "device": str(args.device),
        "attnkit": attnkit,
        "joeynmt": joey,
        "ratio_tokens_per_s": ratio,
        "target_ratio": TARGET_SPEED_RATIO,
        "speed_met": speed_met,
        "bleu_met": bleu_met,
        "met": bool(speed_met and bleu_met),
        "tokens_counted": TOKENS_COUNTED,
        "same_data": same,
        "differences": differences(recipe, attnkit, joey),
        "recipe": project_path(args.recipe),
        "overrides": args.overrides,
        "run_dir": project_path(str(out)),
    }
    return print_result(result, busy_before)


if __name__ == "__main__":
    sys.exit(run_cli(main))
