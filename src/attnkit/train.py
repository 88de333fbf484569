"""A model-agnostic trainer, and the one recipe path every task trains through.

:class:`Trainer` knows nothing about modalities: it gets a model, an objective
``(model, batch) -> LossOutput``, a dataset, a collate function and an
``evaluate(model) -> {"score": ..., ...}`` callback for validation (higher is
better; for translation, BLEU of free-running decoding). It handles device and
mixed precision, gradient clipping, the plateau LR schedule, early stopping, a
JSONL log of every epoch, best/last checkpoints, ``--resume``, an average of the
weights over the steps (``train.ema_decay``) and DistributedDataParallel when
launched with ``torchrun``.

:func:`train_recipe` is the prologue every task shares: join the process group,
check the run folder, seed, let the task read its data and build its model
(:class:`TaskSetup`), claim the folder, train. The tasks (translation,
captioning, multitask) supply only what differs: a ``prepare`` function.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm import tqdm

from attnkit.checkpoint import Checkpoint, load_checkpoint, load_weights, save_checkpoint
from attnkit.config import ExperimentConfig, TrainConfig, save_config, to_dict
from attnkit.data.batching import BatchLimit, BucketBatchSampler, length_multiple, padded_collate
from attnkit.distributed import Distributed, ShardedBatchSampler, autocast, choose_threads, loader_workers, resolve_device, resolve_precision, slow_precision_warning
from attnkit.errors import UserError, out_of_memory
from attnkit.optim import LearningRateSchedule, WeightAverage, load_optimizer_state
from attnkit.run_folder import RunFolder, epoch_checkpoint_name
from attnkit.vocab import Vocabulary
from attnkit.watch import DrawAttention, TensorBoardLog, check_tensorboard

Evaluate = Callable[[nn.Module], dict[str, Any]]
BatchesFor = Callable[[BatchLimit], torch.utils.data.Sampler]  # the global batch's limit -> an epoch's batches (with set_epoch)


@dataclass
class TrainingProgress:
    epoch: int = 0  # epochs completed
    step: int = 0  # optimizer steps taken
    best_score: float = -math.inf
    best_epoch: int = 0  # the epoch best.pt holds
    bad_epochs: int = 0  # validations since the best one
    stopped: bool = False
    seconds: float = 0.0  # wall time of the completed epochs, validation included (kept across --resume)
    stop_reason: str = ""  # "" while running or after the last epoch; "early stopping" or "time budget"
    run_id: str = ""  # names one run across --resume: a folder holding another run is not written over


def _saved_progress(saved: dict[str, Any]) -> TrainingProgress:
    """A checkpoint's progress, each value of its field's type (a TypeError when not: an epoch of 1.5, a best score
    of "x" would otherwise be found an epoch later, or never)."""
    progress = TrainingProgress(**saved)
    for name, kind in TrainingProgress.__annotations__.items():
        value = getattr(progress, name)
        wanted = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}[kind]
        if not isinstance(value, wanted) or (kind != "bool" and isinstance(value, bool)):
            raise TypeError(f"the saved progress's {name} is {value!r}, not a {kind}")
    return progress


@dataclass(frozen=True)
class CheckpointContents:
    """What the task adds to every checkpoint so it rebuilds without other files."""

    task: str
    config: dict[str, Any]
    vocabularies: dict[str, list[str]]
    subword_models: dict[str, bytes] = field(default_factory=dict)


def _silent(_: str) -> None:
    pass


COMPILE_BACKEND = "inductor"  # torch.compile's default; the tests trace with "aot_eager" (no C++ or Triton build)


def compile_layers(model: nn.Module, backend: str | None = None) -> list[str]:
    """``train.compile``: ``torch.compile`` each part a training step runs many times, with dynamic shapes (batch rows
    and lengths change from batch to batch; one graph serves them): every module whose class sets ``compiled_whole``
    (the Transformer layers, the RNN decoder's attention) and every method a module names in ``compiled_methods``
    (the RNN decoder's one-step cell). In place: weights, state-dict keys and checkpoints stay as they are. Returns
    the names of the parts compiled, parents before what they hold (a part inside a compiled one is left to it)."""
    compiled: list[str] = []
    options = {"dynamic": True, "backend": backend or COMPILE_BACKEND}
    for name, module in model.named_modules():
        if any(name.startswith(f"{done}.") for done in compiled):
            continue
        if getattr(module, "compiled_whole", False):
            module.compile(**options)
            compiled.append(name)
        for method in getattr(module, "compiled_methods", ()):
            setattr(module, method, torch.compile(getattr(module, method), **options))
            compiled.append(f"{name}.{method}")
    return compiled


def compile_breaks() -> list[str]:
    """Where torch.compile could not trace a compiled part whole, since the process began or its counters were
    last cleared: the first line of each reason. Such a part runs eager there, in pieces or all of it, and loses
    what ``train.compile`` was chosen for. Empty when every part was traced whole."""
    from torch._dynamo.utils import counters

    reasons = [*counters["graph_break"], *counters["unimplemented"]]  # graph split there / frame left to eager
    return sorted({reason.strip().splitlines()[0] for reason in reasons})


class Trainer:
    def __init__(
        self,
        model: nn.Module,
        objective: Callable[[nn.Module, Any], Any],
        dataset: torch.utils.data.Dataset,
        collate: Callable,
        evaluate: Evaluate,
        config: TrainConfig,
        run_dir: str | Path,
        contents: CheckpointContents,
        progress_bar: bool = True,
        log: Callable[[str], None] = print,
        parameter_groups: list[dict[str, Any]] | None = None,
        batches: BatchesFor | None = None,
        idle_parameters: bool = False,
        distributed: Distributed | None = None,
        device: torch.device | None = None,
        watch: TensorBoardLog | None = None,
    ):
        """``parameter_groups``: Adam's groups (e.g. a lower learning rate for a fine-tuned backbone);
        default: every parameter that requires a gradient, at ``config.lr``. ``batches``: makes an epoch's
        batches for the global batch's limit (``config.batch_size`` or ``batch_tokens`` x ranks); default: length buckets of
        ``dataset.lengths``. ``idle_parameters``: some parameters get no gradient in a step (a joint model's
        other encoder), which DistributedDataParallel must be told. ``distributed`` / ``device``: where this
        process runs (default: from the ``torchrun`` environment and ``config.device``; the group is joined here).
        ``watch``: where rank 0 also writes each epoch's TensorBoard events (``train.tensorboard``)."""
        self.config = config
        self.run_dir = Path(run_dir)
        self.contents = contents
        self.progress_bar = progress_bar
        self.objective = objective
        self.evaluate = evaluate
        self.distributed = distributed or Distributed.from_environment()
        self.device = device or self.distributed.start(resolve_device(config.device))
        self.dtype = resolve_precision(config.precision)
        self.log = log if self.distributed.is_main else _silent
        self.watch = watch if self.distributed.is_main else None
        if warning := slow_precision_warning(self.device, self.dtype):  # every training (and bench) that builds a Trainer
            self.log(warning)

        self.model = model.to(self.device)
        self.train_model = model
        self.compile_breaks_before = set(compile_breaks()) if config.compile else set()  # the process's own, from before this run
        if config.compile:
            self.log(f"compiled (torch.compile, dynamic shapes; each part compiles at its first call): {', '.join(compile_layers(model)) or 'no part of this model'}")
        # With train.ema_decay, validation, best.pt and last.pt see the weights' moving average; last.pt also
        # keeps the weights being trained (training["trained_weights"]), which --resume goes on from.
        self.weight_average = WeightAverage(model, config.ema_decay) if config.ema_decay > 0 else None
        if self.distributed.enabled:
            # With idle parameters DDP must look for them every step; every rank runs the same task in a step
            # (ShardedBatchSampler), so the idle set agrees across ranks and their gradients stay None.
            self.train_model = nn.parallel.DistributedDataParallel(
                model, device_ids=[self.device.index] if self.device.type == "cuda" else None, find_unused_parameters=idle_parameters
            )
        # The fused kernel updates every parameter in one pass (about 10% of a CPU training step saved).
        groups = parameter_groups or [{"params": [p for p in model.parameters() if p.requires_grad]}]
        self.optimizer = torch.optim.Adam(groups, lr=config.lr, weight_decay=config.weight_decay, fused=True)
        self.schedule = LearningRateSchedule(self.optimizer, config)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.dtype == torch.float16)  # a CPU's fp16 underflows unscaled too
        self.progress = TrainingProgress(run_id=uuid.uuid4().hex)
        self.history: list[dict[str, Any]] = []  # one record per epoch; travels in the checkpoint, log.jsonl is written from it

        global_batch = BatchLimit.of(config).times(self.distributed.world_size)
        epoch_batches = batches(global_batch) if batches is not None else BucketBatchSampler(dataset.lengths, global_batch, shuffle=True, seed=config.seed)
        self.batches = ShardedBatchSampler(epoch_batches, self.distributed.rank, self.distributed.world_size)
        on_cuda = self.device.type == "cuda"
        multiple = length_multiple(self.device)
        if multiple > 1:  # padded in the loader's workers, before the batches are pinned
            # Target columns only for a decoder that takes every step at once: an RNN's loop would pay for them.
            pad_targets = not getattr(getattr(model, "decoder", None), "trains_step_by_step", True)
            collate = partial(padded_collate, collate, multiple, pad_targets)
        # On CUDA the loader works beside the GPU (pixels decoded, batches pinned): workers scaled to the cores.
        workers = config.num_workers or (loader_workers(self.distributed.local_world_size) if on_cuda else 0)
        # The loader draws its workers' base seed from this generator, not from the global one, so a resumed
        # run's dropout stream does not shift by the draw a fresh (persistent) loader makes.
        loader_seed = torch.Generator().manual_seed(config.seed + self.distributed.rank)
        self.loader = torch.utils.data.DataLoader(
            dataset, batch_sampler=self.batches, collate_fn=collate, num_workers=workers, pin_memory=on_cuda,
            persistent_workers=workers > 0, generator=loader_seed,
        )  # fmt: skip

    # -- checkpoints -----------------------------------------------------------------------------------
    def _random_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"cpu": torch.get_rng_state()}
        if self.device.type == "cuda":  # this rank's device only: a resume on a machine with fewer GPUs still works
            state["cuda"] = [torch.cuda.get_rng_state(self.device)]
        return state

    def checkpoint(self, random_states: list[dict[str, Any]], trained_weights: dict[str, Tensor] | None = None) -> Checkpoint:
        """The run as it stands; ``random_states``: every rank's generators, in rank order. ``trained_weights``: the
        weights the optimizer steps, when the model now holds their average (what the checkpoint's model is)."""
        training = {
            "progress": asdict(self.progress),
            "history": list(self.history),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.schedule.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": random_states,
        }
        if trained_weights is not None:
            training["trained_weights"] = trained_weights
        contents = self.contents
        return Checkpoint(contents.task, contents.config, contents.vocabularies, self.model.state_dict(), training, subword_models=contents.subword_models)

    def restore(self, checkpoint: Checkpoint) -> None:
        """Continue the run saved in ``checkpoint`` (weights, optimizer, schedule, counters, random generators).

        Checkpoints are written at the end of an epoch, so the data order resumes exactly:
        the next epoch's batches follow from the seed and the epoch number alone.
        """
        checkpoint.refuse_without_training_state()
        training = checkpoint.training
        load_weights(self.model, checkpoint)  # the average, when the run kept one
        try:
            if self.weight_average is not None:  # a run that kept none starts its average here
                self.weight_average.restart_from(self.model)
            if "trained_weights" in training:
                self.model.load_state_dict(training["trained_weights"])
            load_optimizer_state(self.optimizer, training["optimizer"])
            self.schedule.load_state_dict(training["scheduler"])
            if training.get("scaler"):
                self.scaler.load_state_dict(training["scaler"])
            self.progress = _saved_progress(training["progress"])
            self.history = [record for record in training.get("history", []) if record["epoch"] <= self.progress.epoch]
            # A saved stop is decided afresh with the resumed config (its epochs, patience or max_minutes perhaps
            # raised): the same config stops again at once, where an epoch past its budget or patience would run.
            last_epoch_seconds = float(self.history[-1].get("epoch_seconds", 0.0)) if self.history else 0.0
            reason = self._stop_reason(last_epoch_seconds)
            self.progress = replace(self.progress, stopped=bool(reason), stop_reason=reason)
            self._restore_random_state(training)
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError, AttributeError) as error:  # the weights fit, the rest does not
            if out_of_memory(error):  # Adam's state moving to a full GPU: run_cli says so, not "damaged"
                raise
            raise UserError(f"the checkpoint's training state does not fit this run ({type(error).__name__}): it is damaged or from an incompatible version") from None

    def _restore_random_state(self, training: dict[str, Any]) -> None:
        states = training.get("rng") or [{"cpu": training["torch_rng"]}]  # "torch_rng": checkpoints before several ranks were saved
        if len(states) != self.distributed.world_size:
            saved, now, limit = len(states), self.distributed.world_size, BatchLimit.of(self.config)
            setting, value = ("train.batch_tokens", limit.tokens) if limit.tokens else ("train.batch_size", limit.size)
            keep = f"; to keep it, resume with --set {setting}={value * saved // now}" if value * saved % now == 0 else ""
            self.log(
                f"warning: the checkpoint was written by {saved} process(es), this run has {now}. The batch is per process, so a step's"
                f" global batch is now {limit.times(now)} (it was {limit.times(saved)}), at the same learning rate{keep}. Random"
                " streams (dropout, scheduled sampling) start afresh: the result differs from an uninterrupted run"
            )
            torch.manual_seed(self.config.seed + self.distributed.rank + 1000 * self.progress.epoch)
            return
        state = states[self.distributed.rank]
        torch.set_rng_state(state["cpu"])
        if self.device.type == "cuda" and state.get("cuda"):
            torch.cuda.set_rng_state(state["cuda"][0], self.device)

    # -- the loop --------------------------------------------------------------------------------------
    def fit(self) -> TrainingProgress:
        if self.distributed.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        first_epoch = self.progress.epoch + 1
        if self.progress.stopped and self.progress.epoch > 0:  # resumed as it stopped: nothing to train
            self.log(f"the run stopped after epoch {self.progress.epoch} ({self.progress.stop_reason}) and this config stops it there again: "
                     "raise train.patience or train.max_minutes to go on")  # fmt: skip
        while self.progress.epoch < self.config.epochs and not self.progress.stopped:
            epoch = self.progress.epoch + 1
            started = time.perf_counter()
            train_stats = self.train_epoch(epoch)
            record: dict[str, Any] = {"epoch": epoch, "step": self.progress.step, **train_stats}
            record["lr"] = self.schedule.moving_rate(self.progress.step)
            self.end_of_epoch(record, started)
            if self.config.compile and epoch == first_epoch:  # every part has been called by now, validation's too
                breaks = self.compile_breaks()
                self.log(f"torch.compile ran eager where it could not trace: {'; '.join(breaks)}" if breaks else "torch.compile traced every compiled part whole")
        if self.config.max_minutes > 0:
            self.log(budget_summary(self.progress, self.config))
        return self.progress

    def compile_breaks(self) -> list[str]:
        """train.compile: where torch.compile ran this run's compiled parts eager (:func:`compile_breaks`)."""
        return [reason for reason in compile_breaks() if reason not in self.compile_breaks_before]

    def train_epoch(self, epoch: int) -> dict[str, float]:
        self.train_model.train()
        self.batches.set_epoch(epoch)
        world = self.distributed.world_size
        # Running sums stay on the device: reading them every batch would wait for the GPU each time.
        loss_sum = nll_sum = nll_tokens = tokens = examples = torch.zeros((), dtype=torch.float64, device=self.device)
        # The objective's own sums (e.g. SCST's reward) and the examples of the batches that gave them, whose mean
        # the epoch reports (a joint model's translation batches give no reward and do not dilute it).
        statistics: dict[str, Tensor] = {}
        statistic_examples: dict[str, Tensor] = {}
        batches, perplexity = 0, False  # a perplexity only over the batches that read references (not SCST's)
        started = time.perf_counter()
        bar = tqdm(
            self.loader, desc=f"epoch {epoch}", leave=False, mininterval=1.0, disable=not (self.progress_bar and self.distributed.is_main)
        )
        steps = len(self.loader)  # this epoch's, the same on every rank
        for index, batch in enumerate(bar):
            loss, out = self.train_step(batch, position=epoch - 1 + index / steps)
            batches += 1
            loss_sum = loss_sum + loss.detach() / world  # this rank's share of the global batch's mean loss
            if out.nll_sum is not None:
                perplexity = True
                nll_sum = nll_sum + out.nll_sum
                nll_tokens = nll_tokens + out.tokens
            tokens = tokens + out.tokens
            examples = examples + out.examples
            for name, value in out.statistics.items():
                statistics[name] = statistics.get(name, 0.0) + value.to(torch.float64)
                statistic_examples[name] = statistic_examples.get(name, 0.0) + out.examples.to(torch.float64)
            if batches % self.config.log_every == 0 and not bar.disable:
                bar.set_postfix(loss=f"{loss_sum.item() * world / batches:.3f}")  # about the global mean (ranks' shares are alike)
        if self.device.type == "cuda":  # the last steps may still be queued: the epoch ends when the GPU has run them
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - started
        if batches == 0:
            raise UserError("the training set yields no batches (is it empty, or are all pairs longer than the length limits?)")
        sums = [loss_sum / batches, nll_sum, nll_tokens, tokens, examples, *statistics.values(), *statistic_examples.values()]
        totals = self.distributed.sum(torch.stack(sums)).tolist()  # over the ranks
        mean_loss, nll_sum, nll_tokens, tokens, examples = totals[:5]
        kinds = len(statistics)
        record = {"train_loss": round(mean_loss, 4)}
        if perplexity:
            record["train_ppl"] = round(math.exp(min(nll_sum / max(nll_tokens, 1), 50.0)), 3)
        record["train_tokens_per_s"] = round(tokens / seconds, 1)  # every rank's tokens
        if statistics:  # the objective's own, per example of the batches that gave them (SCST: the sampled captions' mean reward)
            record["train_statistics"] = {
                name: round(total / max(count, 1), 4) for name, total, count in zip(statistics, totals[5 : 5 + kinds], totals[5 + kinds :])
            }
        return record

    def train_step(self, batch: Any, position: float | None = None) -> tuple[Tensor, Any]:
        """One optimizer step on ``batch`` (this rank's share of a global batch) at ``position`` in the run (epochs
        done, counted in steps; what ``train.decay_epochs`` reads, :meth:`LearningRateSchedule.decayed`) -> the loss
        as the ranks' mean sees it and the objective's output. It reads nothing back from the device: a GPU runs on
        unhindered (fp16's loss scaler too: it hands fused Adam its inf check as a tensor, and Adam skips such a step
        on the device)."""
        world = self.distributed.world_size
        batch = batch.to(self.device, non_blocking=True)
        self.schedule.before_step(self.progress.step, position)
        with autocast(self.device, self.dtype):
            out = self.objective(self.train_model, batch)
        # Normalise by the global batch's tokens and examples: DDP averages the ranks' gradients, so
        # each rank scales its sums by world / global count, and N ranks x batch B equal one batch of N x B.
        counts = self.distributed.sum(torch.stack([out.tokens, out.examples]).to(torch.float32))  # (2,)
        loss = out.loss(counts[0], counts[1]) * world
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        if self.config.clip_norm > 0:
            self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.schedule.moving_parameters(self.progress.step), self.config.clip_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if self.weight_average is not None:
            self.weight_average.update(self.model, self.progress.step)
        self.progress.step += 1
        return loss, out

    def end_of_epoch(self, record: dict[str, Any], started: float) -> None:
        """Validate, step the LR schedule, decide whether to stop, save checkpoints (rank 0; the others follow)."""
        random_states = self.distributed.gather(self._random_state())  # every rank's, for an exact --resume

        def validate_and_save() -> tuple[TrainingProgress, list[float]]:
            self._validate_and_save(record, started, random_states)
            return self.progress, [group["lr"] for group in self.optimizer.param_groups]

        self.progress, rates = self.distributed.on_main(validate_and_save)  # the others follow rank 0's decisions
        for group, lr in zip(self.optimizer.param_groups, rates):
            group["lr"] = lr

    def _validate_and_save(self, record: dict[str, Any], started: float, random_states: list[dict[str, Any]]) -> None:
        # With a weight average, the model holds it from here to the log line (trained_weights: see checkpoint()).
        averaged = self.weight_average.swapped_in(self.model) if self.weight_average is not None else contextlib.nullcontext()
        with averaged as trained_weights:
            self._validate_and_save_weights(record, started, random_states, trained_weights)

    def _validate_and_save_weights(
        self, record: dict[str, Any], started: float, random_states: list[dict[str, Any]], trained_weights: dict[str, Tensor] | None
    ) -> None:
        """Validate the weights the model holds, save them, log the epoch."""
        self.model.eval()
        with torch.no_grad(), autocast(self.device, self.dtype):
            metrics = self.evaluate(self.model)
        # Plain Python values only (a metric may be a numpy float): the record travels in the checkpoint's history,
        # which must load with weights_only=True.
        metrics = json.loads(json.dumps(metrics))
        score = float(metrics["score"])
        record["valid"] = metrics
        self.schedule.after_validation(score, self.progress.step)
        progress = self.progress
        improved = score > progress.best_score
        # A tie keeps the later checkpoint (it has trained longer and validates no worse: a task that
        # saturates its metric early would otherwise keep its first perfect epoch), but only a real
        # improvement resets the early-stopping count.
        kept = score >= progress.best_score
        record["best"] = kept
        progress.epoch = record["epoch"]
        if kept:
            progress.best_score, progress.best_epoch = score, progress.epoch
        progress.bad_epochs = 0 if improved else progress.bad_epochs + 1
        epoch_seconds = time.perf_counter() - started
        progress.seconds += epoch_seconds
        record["epoch_seconds"] = round(epoch_seconds, 2)
        progress.stop_reason = self._stop_reason(epoch_seconds)
        progress.stopped = bool(progress.stop_reason)
        if progress.stop_reason:
            record["stop"] = progress.stop_reason
        self.history.append(record)
        if self.watch is not None:  # before the checkpoints: a kill in between redoes this epoch, whose events the resume hides
            with torch.no_grad(), autocast(self.device, self.dtype):
                self.watch.log_epoch(record, self.model)
        checkpoint = self.checkpoint(random_states, trained_weights)
        # best.pt before last.pt: a kill between the two leaves best.pt ahead, never behind; resuming
        # last.pt redoes the epoch exactly. log.jsonl is rebuilt from the checkpoint's history on resume.
        folder = RunFolder(self.run_dir)
        if kept:
            save_checkpoint(self.run_dir / "best.pt", checkpoint)
        if self.config.keep_epochs > 0:  # the weights alone (no training state): what attnkit average averages
            save_checkpoint(self.run_dir / epoch_checkpoint_name(progress.epoch), replace(checkpoint, training={}))
            # Pruned before last.pt: a kill after last.pt (the run's last epoch) would leave one epoch too many, which
            # no resume would prune; a kill before it redoes this epoch, which rewrites this file and prunes again.
            folder.keep_last_epochs(self.config.keep_epochs)
        save_checkpoint(self.run_dir / "last.pt", checkpoint)
        folder.write_log(self.history)
        self.log(
            f"epoch {record['epoch']}: loss {record['train_loss']:.3f}, "
            + "".join(f"{name} {value}, " for name, value in record.get("train_statistics", {}).items())
            + f"{record['train_tokens_per_s']:.0f} tok/s, valid "
            + ", ".join(f"{k} {v}" for k, v in metrics.items() if isinstance(v, (int, float)))
            + (" (best)" if kept else "")
            + (f"; stopping ({progress.stop_reason}{self.schedule.cut_short(progress.epoch)})" if progress.stop_reason else "")
        )

    def _stop_reason(self, last_epoch_seconds: float) -> str:
        """Why training stops after the epochs completed so far ("" : it goes on, or ends with its last epoch): the
        validations since the best reached ``patience``, or one more epoch as long as the last would end past
        ``max_minutes`` of training."""
        progress = self.progress
        if self.config.patience > 0 and progress.bad_epochs >= self.config.patience:
            return "early stopping"
        if 0 < self.config.max_minutes and progress.epoch < self.config.epochs and progress.seconds + last_epoch_seconds > self.config.max_minutes * 60:
            return "time budget"
        return ""


def budget_summary(progress: TrainingProgress, config: TrainConfig) -> str:
    """How many of a time-budgeted run's epochs its budget allowed, in one line for the end of training: the
    same recipe runs fewer epochs on a slower machine (BENCHMARKS.md, "Comparing machines")."""
    ran = f"{progress.epoch} of {config.epochs} epochs in {progress.seconds / 60:.1f} of {config.max_minutes:g} minutes"
    if progress.stop_reason == "time budget":
        return f"time budget: it allowed {ran}"
    return f"time budget: {ran} ({progress.stop_reason or 'every epoch ran'})"


def validation_subset(examples: list, config: TrainConfig) -> list:
    """The validation examples decoded each epoch: the first ``valid_max_examples`` (all when 0)."""
    return examples[: config.valid_max_examples] if config.valid_max_examples > 0 else examples


# -- the recipe path -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunContext:
    """What a task's ``prepare`` may use: where this process runs and how it reports."""

    distributed: Distributed
    device: torch.device
    log: Callable[[str], None]


@dataclass(frozen=True)
class TaskSetup:
    """What differs between tasks: everything :func:`train_recipe` needs to train one."""

    config: ExperimentConfig  # resolved (languages, weights digest): stored in the run folder and checkpoints
    model: nn.Module
    objective: Callable[[nn.Module, Any], Any]
    dataset: torch.utils.data.Dataset
    collate: Callable
    validate: Evaluate
    vocabularies: dict[str, list[str]]
    parameter_groups: list[dict[str, Any]] | None = None
    batches: BatchesFor | None = None
    idle_parameters: bool = False  # see Trainer
    validation_examples: int = 1  # examples validate() decodes (training refuses to start with none)
    notes: list[str] = field(default_factory=list)  # lines for the log: data and model sizes
    subword_models: dict[str, bytes] = field(default_factory=dict)  # the text pipeline's sentencepiece models, for checkpoints
    draw_attention: DrawAttention | None = None  # one fixed validation example's attention, for train.tensorboard


Prepare = Callable[[ExperimentConfig, "Checkpoint | None", RunContext], TaskSetup]


# Recipes sized for two CPU cores whose GPU variant (tasks/configs/<variant>.yaml: the same model and data on batches
# by tokens, the learning rate scaled) scored the recipe's quality (BENCHMARKS.md, issue 47). flickr8k_gpu.yaml is
# not here: after self-critical training it scored under flickr8k.yaml on test, which stays the captioning recipe.
GPU_VARIANTS = {
    "multi30k_de_en_transformer": "multi30k_de_en_transformer_gpu",
    "multi30k_de_en_subword": "multi30k_de_en_subword_gpu",
}


def gpu_variant_note(device: torch.device, config: ExperimentConfig, resuming: bool) -> str | None:
    """The line said when a recipe made for two CPU cores starts on a GPU and has a GPU variant: its batches of
    64 examples leave a GPU mostly idle (a step is a few milliseconds of kernel launches). Not for a resumed run
    (its batches are the run's) or one that already batches by tokens."""
    variant = GPU_VARIANTS.get(config.name)
    if device.type != "cuda" or variant is None or resuming or config.train.batch_tokens:
        return None
    return (
        f"note: {config.name} batches {config.train.batch_size} examples, sized for two CPU cores; on a GPU its steps are "
        f"mostly kernel launches. tasks/configs/{variant}.yaml is its GPU variant: the same model and data on batches "
        "by tokens, the learning rate scaled (docs/scaling.md), at the recipe's quality (BENCHMARKS.md)"
    )


def too_few_examples(count: int, processes: int, what: str = "training examples") -> str:
    """The message for a training set that cannot give each of ``processes`` an example."""
    if count == 0:
        return f"no usable {what} (is the training split empty, or is every example over the length limits?)"
    return f"{count} usable {what} for {processes} processes: each process needs at least one (train with fewer processes, or on more data)"


def train_recipe(
    config: ExperimentConfig,
    task: str,
    prepare: Prepare,
    resume: Checkpoint | None = None,
    overwrite: bool = False,
    progress_bar: bool = True,
    log: Callable[[str], None] = print,
) -> TrainingProgress:
    """Train (or continue) a ``task`` model as ``config`` says; checkpoints go to ``config.run_dir``.

    The order matters: the process group first (so ranks can agree on anything); the cheap
    run-folder check; the task's data and model (every error a config can cause surfaces here,
    before anything is removed); then rank 0 claims the folder and, with ``overwrite``, removes
    the previous run's files (never other files); then training.
    """
    distributed = Distributed.from_environment()
    device = distributed.start(resolve_device(config.train.device))
    log = log if distributed.is_main else _silent
    try:
        if resume is not None:  # before any work: a changed architecture may fit the saved weights by chance
            resume.refuse_without_training_state()
            resume.refuse_another_model(config)
        if config.train.tensorboard and distributed.is_main:
            check_tensorboard(config.run_dir)  # a missing package, or a file where the events go, is said before any work
        threads = choose_threads(config.train.threads, distributed.local_world_size)
        torch.set_num_threads(threads)
        log(f"{config.task} on {device}" + (f", rank 0 of {distributed.world_size}" if distributed.enabled else "") + f", {threads} CPU thread(s), batches of {BatchLimit.of(config.train)}")
        if note := gpu_variant_note(device, config, resuming=resume is not None):
            log(note)
        folder = RunFolder(config.run_dir)
        distributed.on_main(lambda: check_run_folder(folder, resume, overwrite))
        torch.manual_seed(config.train.seed)  # the same initial weights on every rank
        setup = prepare(config, resume, RunContext(distributed, device, log))
        if resume is not None:  # again as resolved: an emptied data.source_lang was filled in from dataset.json, perhaps the other way round
            resume.refuse_another_model(setup.config)
        for note in setup.notes:
            log(note)
        if len(setup.dataset) < distributed.world_size:
            raise UserError(too_few_examples(len(setup.dataset), distributed.world_size))
        if setup.validation_examples < 1:
            raise UserError("the validation split is empty: training validates every epoch")
        outputs = Vocabulary(setup.vocabularies["target"])  # a beam the vocabulary cannot fill is refused now, not after an epoch
        outputs.check_beam(setup.config.train.valid_beam_size, "train.valid_beam_size")
        outputs.check_beam(setup.config.search.beam_size, "search.beam_size")
        torch.manual_seed(setup.config.train.seed + distributed.rank)  # dropout and scheduled sampling differ per rank
        trainer = Trainer(
            setup.model,
            setup.objective,
            setup.dataset,
            setup.collate,
            setup.validate,
            setup.config.train,
            folder.path,
            CheckpointContents(task, to_dict(setup.config), setup.vocabularies, setup.subword_models),
            progress_bar=progress_bar,
            log=log,
            parameter_groups=setup.parameter_groups,
            batches=setup.batches,
            idle_parameters=setup.idle_parameters,
            distributed=distributed,
            device=device,
            watch=TensorBoardLog(folder.path, setup.draw_attention) if setup.config.train.tensorboard and distributed.is_main else None,
        )
        if resume is not None:  # a checkpoint that does not fit fails here, before the folder is touched
            trainer.restore(resume)
            log(f"resuming after epoch {trainer.progress.epoch} (best score {trainer.progress.best_score})")
        with contextlib.ExitStack() as held:
            distributed.on_main(lambda: _claim(held, folder, trainer, resume, overwrite, setup.config, log))
            if trainer.watch is not None:
                held.callback(trainer.watch.close)
            progress = trainer.fit()
        distributed.barrier()  # every rank is done talking before any tears its connections down
        return progress
    finally:
        distributed.stop()


def check_run_folder(folder: RunFolder, resume: Checkpoint | None, overwrite: bool) -> None:
    """Refuse, before any work, a run that would write over another one without ``overwrite``.

    A new run needs a folder without a run. A resumed run may write where the same run
    stands at the same epoch (its own folder, or a copy of it); another run's folder, or
    its own folder at a later epoch (resuming best.pt would rewind last.pt), needs ``overwrite``.
    """
    folder.refuse_non_files()  # a folder named last.pt failed after an epoch's work
    if resume is None:
        folder.refuse_existing(overwrite)
        return
    if overwrite:
        return
    if not folder.holds_run():
        resumed_run = _progress(resume).get("run_id", "")
        own_best = (folder.path / "best.pt").is_file() and folder.standing_progress("best.pt").get("run_id") == resumed_run
        if not own_best:  # another run's best.pt or epoch-<k>.pt, without its last.pt: not this run's to write over
            folder.refuse_existing(overwrite=False)
        return
    standing = folder.standing_progress()
    resumed = _progress(resume)
    if standing.get("run_id", "") != resumed.get("run_id", ""):
        raise UserError(f"{folder.path} holds another run (at epoch {standing.get('epoch')}); resuming there would replace it: pass --overwrite, or set another output_dir")
    if standing.get("epoch", 0) > resumed.get("epoch", 0):
        raise UserError(
            f"{folder.path / 'last.pt'} is at epoch {standing.get('epoch')} but the checkpoint resumed is at epoch {resumed.get('epoch')}: "
            "continuing would rewind the run; pass --overwrite to rewind it, or set another output_dir"
        )


def _claim(held: contextlib.ExitStack, folder: RunFolder, trainer: Trainer, resume: Checkpoint | None, overwrite: bool, config: ExperimentConfig, log) -> None:
    """Rank 0, once everything has been read and built without error: lock the folder for the run, clear a
    replaced run's files, store the resolved config; a resumed run's state is on disk before training goes on."""
    held.enter_context(folder.claim())
    check_run_folder(folder, resume, overwrite)  # again under the lock: another process may have started a run meanwhile
    replacing = overwrite and folder.holds_checkpoints() and not _continues(folder, resume)
    # A rewind: the folder's own run (its last.pt's run_id) goes on from an earlier epoch of its own
    rewinding = replacing and resume is not None and bool(run := _standing(folder).get("run_id")) and run == _progress(resume).get("run_id")
    settings_changed = resume is not None and resume.config != trainer.contents.config
    if settings_changed:  # --set on a resume (more epochs, another rate): config.yaml and every later checkpoint hold them
        resume = replace(resume, config=trainer.contents.config)  # so does the last.pt below: a kill before the epoch ends keeps them
    if resume is not None and (replacing or not folder.holds_run()):
        # A new folder, or one whose run this one replaces (a rewind): the resumed state is on disk before training
        # goes on and before any old file goes, each write atomic, so a kill at any moment leaves a run to resume
        # (removing first lost both, the checkpoint being resumed among them). best.pt before last.pt: a kill
        # between the two leaves a folder a resume refills.
        _carry_best(folder, resume, log)
        save_checkpoint(folder.path / "last.pt", resume)
    elif settings_changed:  # the run's own folder, at the epoch resumed
        save_checkpoint(folder.path / "last.pt", resume)
    if replacing:
        kept = [] if resume is None else ["last.pt", "config.yaml", "log.jsonl", *(["best.pt"] if _best_of(folder) == _best_of_progress(resume) else [])]
        removed = folder.remove_run_files(keep=kept, rewound_to=_progress(resume).get("epoch", 0) if rewinding else None)
        log(f"--overwrite: removed {', '.join(path.name for path in removed) or 'nothing else'} of the previous run in {folder.path}")
    save_config(config, folder.path / "config.yaml")
    if resume is not None:
        folder.write_log(trainer.history)  # repairs a log a kill left a line short or long (and replaces the old run's)


def _carry_best(folder: RunFolder, resume: Checkpoint, log) -> None:
    """A run resumed into a new folder brings its best.pt: the resumed checkpoint itself when its epoch is the best,
    else the best.pt beside it when that is the same run's best epoch. Without it the folder would have no best.pt
    until an epoch beat the best score, and none at all if none did."""
    progress = resume.training["progress"]
    if progress.get("best_epoch") == progress.get("epoch"):
        save_checkpoint(folder.path / "best.pt", resume)
        return
    best = _best_of_progress(resume)
    if _best_of(folder) == best:  # already here: the run's own folder, its last.pt deleted
        return
    beside = RunFolder(resume.read_from.parent) if resume.read_from is not None else None
    if beside is not None and _best_of(beside) == best:
        try:
            carried = load_checkpoint(beside.path / "best.pt")
        except UserError as error:  # its progress read, the rest damaged: the run goes on without it
            log(f"note: the best.pt beside the resumed checkpoint cannot be brought ({error}); {folder.path} gets one when an epoch beats the best score")
            return
        save_checkpoint(folder.path / "best.pt", carried)
        log(f"best.pt (epoch {best[1]}) brought from {beside.path}")
        return
    log(f"note: no best.pt of this run's best epoch ({best[1]}) lies beside the resumed checkpoint; {folder.path} gets one when an epoch beats the best score")


def _best_of_progress(checkpoint: Checkpoint) -> tuple[str | None, int | None]:
    """The run and best epoch a checkpoint's progress names: the best.pt that belongs with it."""
    progress = checkpoint.training["progress"]
    return progress.get("run_id"), progress.get("best_epoch")


def _best_of(folder: RunFolder) -> tuple[str | None, int | None]:
    """The run and epoch of the folder's best.pt ((None, None) if it has none, or one that cannot be read)."""
    if not (folder.path / "best.pt").is_file():
        return None, None
    try:
        standing = folder.standing_progress("best.pt")
    except UserError:
        return None, None
    return standing.get("run_id"), standing.get("epoch")


def _standing(folder: RunFolder) -> dict[str, Any]:
    """The progress of the folder's last.pt; empty when it has none or a damaged one (nothing to continue)."""
    try:
        return folder.standing_progress()
    except UserError:
        return {}


def _progress(checkpoint: Checkpoint) -> dict[str, Any]:
    return checkpoint.training.get("progress", {})


def _continues(folder: RunFolder, resume: Checkpoint | None) -> bool:
    """Does ``resume`` go on from where the folder's run stands (same run, same epoch)?"""
    if resume is None or not (standing := _standing(folder)):
        return False
    resumed = _progress(resume)
    return (standing.get("run_id"), standing.get("epoch")) == (resumed.get("run_id"), resumed.get("epoch"))
