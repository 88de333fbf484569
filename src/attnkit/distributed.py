"""Where a process runs: device, precision, CPU threads, and its place in a ``torchrun`` job.

One :class:`Distributed` describes the job (rank 0 of 1 when run plainly). The rules
that keep several processes right, by construction:

* the process group is joined before anything else happens (data, feature cache, run folder);
* each rank works on its own device (``cuda:LOCAL_RANK``);
* work that writes shared files runs on rank 0 first (:meth:`Distributed.main_first`): the
  feature cache is computed once and the other ranks read it;
* only rank 0 prints, validates and writes checkpoints and logs;
* every rank sees the same *global* batches and takes its slice of each
  (:class:`ShardedBatchSampler`), so all ranks run the same task in the same step and
  N ranks x batch B train exactly as one process with batch N x B (B examples, or B target tokens).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import re
import socket
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import torch
import torch.distributed as dist

from attnkit.config import DECODING_PRECISIONS
from attnkit.errors import UserError

T = TypeVar("T")

# Two limits on how long a rank waits for the others. A step's collectives (the gradients, the loss's counts) wait
# for ranks doing the same work, so a rank that stops without dying (a stalled read, a deadlock) fails the job in
# STEP_TIMEOUT; it had held the others for the whole of the longer limit. The waits for rank 0 alone (it validates,
# writes checkpoints, computes a feature cache) run on a group of their own with RANK_0_WORK_TIMEOUT.
STEP_TIMEOUT = datetime.timedelta(minutes=10)
RANK_0_WORK_TIMEOUT = datetime.timedelta(hours=2)


def end_process(code: int) -> NoReturn:
    """Exit with ``code``; a rank of a several-process job leaves without the interpreter's teardown.

    DistributedDataParallel keeps gloo's process group and its threads alive after
    destroy_process_group (PyTorch 2.14; the threads run until the process ends). Tearing the
    interpreter down beside them can abort a rank (SIGABRT, "terminate called without an active
    exception") after a run that has finished and written everything, and torchrun then reports
    the job failed. So a rank flushes what it printed and ends at once; one process exits normally.
    """
    try:
        several = Distributed.from_environment().enabled
    except UserError:  # a malformed torchrun environment: main has already said so (and returned non-zero)
        several = False
    if not several:
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when present, else CPU; a clear error for devices that are not there (or not supported).

    On CUDA, fp32 matrix products then use TF32 (``set_float32_matmul_precision("high")``): what "fp32"
    means on a GPU here, for training and decoding alike. ``cuda:N`` also becomes the process's current device, so
    what runs on the current one (the loader's pinning thread) opens no context on GPU 0 beside it.
    """
    device = _device_named(name)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
        if device.index is not None:
            torch.cuda.set_device(device)
    return device


def _device_named(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", name):
        raise UserError(f"unknown device '{name}'; use auto, cpu, cuda or cuda:N")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device '{name}' asked for, but CUDA is not available here; use device auto or cpu")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise UserError(f"device '{name}' asked for, but this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def resolve_precision(name: str) -> torch.dtype:
    """Autocast dtype: ``auto`` is fp32 on every device (TF32 matrix products on CUDA, see resolve_device).

    Mixed precision is a recipe's choice, not the default: on an NVIDIA H200 with GPU-sized token batches, bf16
    autocast trained five of the six recipes' models 7-25 % slower than fp32 + TF32 (BENCHMARKS.md, "Fast on a GPU,
    issue 47: on an H200"). These models leave the GPU idle most of a step, so the cast of every weight and the
    autocast dispatch cost more than bf16's products save. A recipe measured faster in bf16 sets it.
    """
    choices = {"auto": torch.float32, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if name not in choices:
        raise UserError(f"precision must be auto, fp32, bf16 or fp16, got '{name}'")
    return choices[name]


PRECISION_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def decoding_precision(requested: str, trained: str) -> torch.dtype:
    """The autocast dtype a checkpoint decodes under. ``checkpoint``: its ``train.precision`` (``trained``), as its
    validation decoded, so a test score and a validation score are computed alike. ``fp32`` or ``bf16``: that one, e.g.
    fp32 for a bf16 checkpoint on a CPU without bf16 instructions, where its beam search ran 3.3-4.2x slower."""
    if requested not in DECODING_PRECISIONS:
        raise UserError(f"the decoding precision must be {', '.join(DECODING_PRECISIONS)}, got '{requested}'")
    return resolve_precision(trained if requested == "checkpoint" else requested)


def cpu_has_bf16_instructions() -> bool | None:
    """Whether this x86 CPU multiplies bf16 in hardware (``avx512_bf16`` or AMX, as torch's own probes find them);
    None where that is not known (another architecture, a torch without the probes)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    if None in probes:
        return None
    return any(probe() for probe in probes)


def slow_precision_warning(device: torch.device, dtype: torch.dtype, decoding: bool = False) -> str | None:
    """The line said before training (a Trainer) or decoding (``decoding``: the commands that load a checkpoint) in
    ``dtype`` on ``device`` where it runs far slower than fp32: bf16 autocast on an x86 CPU without bf16 instructions,
    where its matrix products run in software (a recipe's bf16 was measured on CPUs that have them). None where
    nothing is known to be slow."""
    if device.type != "cpu" or dtype != torch.bfloat16 or cpu_has_bf16_instructions() is not False:
        return None
    if decoding:
        measured = "its beam search ran 3.3-4.2x slower on two AVX2 cores"
        remedy = "--precision fp32 decodes in fp32 (scores then may differ a little from those decoded in bf16)"
    else:
        measured = "the Multi30k Transformer recipe trained 22x slower on two AVX2 cores"
        remedy = "--set train.precision=fp32 trains in fp32"
    return (
        "warning: bf16 autocast on a CPU without bf16 instructions (avx512_bf16 or AMX): its matrix products run in "
        f"software here, far slower than fp32 ({measured}, BENCHMARKS.md); {remedy}"
    )


def autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask; all cores where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def loader_workers(ranks_on_this_machine: int = 1) -> int:
    """Data loader workers for a GPU training: this process's share of the usable cores, one left for the process
    itself, between 1 and 8 (beyond that workers only add start-up time and memory)."""
    return max(1, min(8, usable_cores() // max(1, ranks_on_this_machine) - 1))


def choose_threads(requested: int, ranks_on_this_machine: int = 1) -> int:
    """Torch CPU threads: ``requested`` when set, else this process's share of its usable cores.

    More threads than free cores makes OpenMP threads wait for each other: beside one other
    busy process on two cores, a 2-thread training ran about 10x slower than alone. The share
    cannot see other programs' load; set ``train.threads`` when the machine is busy.
    """
    if requested > 0:
        return requested
    return max(1, usable_cores() // max(1, ranks_on_this_machine))


@dataclass(frozen=True)
class Distributed:
    """Where this process sits in a ``torchrun`` job (rank 0 of 1 when run plainly)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @classmethod
    def from_environment(cls) -> "Distributed":
        """The job ``torchrun`` describes in the environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE)."""
        try:
            world = int(os.environ.get("WORLD_SIZE", "1"))
            local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
            return cls(int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0")), local_world)
        except ValueError:
            raise UserError("RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE must be integers (launch with torchrun)") from None

    def own_gpu(self, visible: int) -> int:
        """This rank's GPU among the ``visible`` ones: its local rank (torchrun shows each process all the machine's
        GPUs), or the only one a launcher shows it (e.g. SLURM's ``--gpus-per-task=1``)."""
        if visible == 1:
            return 0
        if self.local_rank >= visible:
            raise UserError(
                f"LOCAL_RANK {self.local_rank} has no GPU of its own: this process sees {visible} CUDA device(s); "
                "start at most one process per GPU (torchrun --nproc_per_node)"
            )
        return self.local_rank

    def start(self, device: torch.device) -> torch.device:
        """Join the process group (NCCL on CUDA, gloo on CPU) before anything else; returns this rank's device."""
        if not self.enabled:
            return device
        if device.type == "cuda":
            device = torch.device("cuda", self.own_gpu(torch.cuda.device_count()))
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", timeout=STEP_TIMEOUT)
        if device.type == "cuda":
            gpus = self.gather_through_store("gpu", f"GPU {torch.cuda.get_device_properties(device).uuid} on {socket.gethostname()}")
            if message := shared_gpu_message(gpus):
                raise UserError(message)
        _WAITING_FOR_RANK_0[:] = [dist.new_group(timeout=RANK_0_WORK_TIMEOUT)]  # every rank makes it, in the same order
        return device

    def stop(self) -> None:
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()  # every group, the waits' too
            _WAITING_FOR_RANK_0.clear()

    def barrier(self) -> None:
        """Wait until every rank is here, for as long as rank 0's own work may take (RANK_0_WORK_TIMEOUT)."""
        if self.enabled:
            dist.barrier(group=_waiting_for_rank_0())

    @contextlib.contextmanager
    def main_first(self) -> Iterator[None]:
        """Rank 0 runs the block first; the others wait, then run it (reading what rank 0 wrote)."""
        if not self.is_main:
            self.barrier()
        try:
            yield
        finally:  # even when rank 0 fails: the others then run the block and meet the same error themselves
            if self.is_main:
                self.barrier()

    def on_main(self, work: Callable[[], T]) -> T:
        """Run ``work`` on rank 0 only and give every rank its result. When it fails, rank 0 raises its error and
        the other ranks a UserError that says so, rather than waiting for rank 0 forever."""
        if not self.enabled:
            return work()
        outcome: list[Any] = [None, None]
        failure: BaseException | None = None
        if self.is_main:
            try:
                outcome = [work(), None]
            except Exception as error:
                failure, outcome = error, [None, str(error) if isinstance(error, UserError) else f"rank 0 failed ({type(error).__name__}: {error})"]
        dist.broadcast_object_list(outcome, src=0, group=_waiting_for_rank_0())
        if failure is not None:
            raise failure
        if outcome[1] is not None:
            raise UserError(outcome[1])
        return outcome[0]

    def gather(self, value: T) -> list[T]:
        """Every rank's ``value``, in rank order (on every rank)."""
        if not self.enabled:
            return [value]
        values: list[Any] = [None] * self.world_size
        dist.all_gather_object(values, value)
        return values

    def gather_through_store(self, key: str, value: str) -> list[str]:
        """Every rank's ``value``, in rank order, through the job's key-value store (the one its ranks met through):
        for a question asked before NCCL's first collective, which would fail on it with an error of its own (two ranks
        on one GPU). No process group is used, so nothing but NCCL has to reach the other machines."""
        if not self.enabled:
            return [value]
        store = dist.distributed_c10d._get_default_store()
        store.set(f"attnkit/{key}/{self.rank}", value)
        return [store.get(f"attnkit/{key}/{rank}").decode() for rank in range(self.world_size)]  # get waits for the key

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over the ranks (a new tensor; the input is unchanged)."""
        if not self.enabled:
            return tensor
        total = tensor.clone()
        dist.all_reduce(total)
        return total


def shared_gpu_message(gpu_of_rank: list[str]) -> str | None:
    """The error for ranks that would share a GPU (``gpu_of_rank[r]``: rank r's GPU, named by its UUID), else None.

    A process that sees one GPU takes it (:meth:`Distributed.own_gpu`), as SLURM's ``--gpus-per-task=1`` wants; but
    ``torchrun --nproc_per_node 2`` on a one-GPU machine shows both processes that one GPU too, and alone neither
    can tell the two cases apart. Compared across the ranks, they can.
    """
    first_rank: dict[str, int] = {}
    for rank, gpu in enumerate(gpu_of_rank):
        if gpu in first_rank:
            return (
                f"ranks {first_rank[gpu]} and {rank} would both train on {gpu}: start at most one process per GPU "
                "(torchrun --nproc_per_node at most the machine's GPUs; with SLURM, one task per GPU)"
            )
        first_rank[gpu] = rank
    return None


_WAITING_FOR_RANK_0: list[Any] = []  # the process group of the waits for rank 0's work, once Distributed.start made it


def _waiting_for_rank_0() -> Any:
    """The group whose collectives wait for rank 0's own work; the default group where it was not made (a process
    group started by other code)."""
    return _WAITING_FOR_RANK_0[0] if _WAITING_FOR_RANK_0 else None


class ShardedBatchSampler(torch.utils.data.Sampler[list[int]]):
    """This rank's slice of every global batch: ``batch[rank::world_size]``.

    The wrapped sampler makes global batches (world_size x the per-rank batch size), the same
    on every rank (same seed). Slicing each one keeps the ranks in step: they run the same
    task in the same step (a joint model's batch is one task's), and together they see
    exactly the batch one process would. A global batch too small to give every rank an
    example is skipped by all ranks alike.
    """

    def __init__(self, batches: torch.utils.data.Sampler[list[int]], rank: int, world_size: int):
        self.batches, self.rank, self.world_size = batches, rank, world_size

    def set_epoch(self, epoch: int) -> None:
        self.batches.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.batches:
            if len(batch) >= self.world_size:
                yield batch[self.rank :: self.world_size]

    def __len__(self) -> int:  # an upper bound: it counts the (rare) global batches too short to share
        return len(self.batches)
