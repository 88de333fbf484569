"""Training on several processes: DistributedDataParallel over gloo on CPU, through each of the three recipes.

Each test spawns two ranks as ``torchrun`` would describe them (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR/PORT in the environment) and calls the recipe as tasks/train.py does.
"""

from __future__ import annotations

import faulthandler
import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from attnkit.checkpoint import load_checkpoint
from attnkit.config import load_config
from attnkit.data.text import write_parallel_dataset
from attnkit.distributed import Distributed, end_process, shared_gpu_message
from attnkit.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import reverse_pair  # noqa: E402
from test_captioning import TINY as TINY_CAPTIONING, write_shape_images  # noqa: E402
from test_train import LEARNS  # noqa: E402

JOINT = [
    "task=multitask", "data.tokenizer.kind=space", "image_encoder.backbone=resnet18", "image_encoder.image_size=64",
    "image_encoder.grid_size=2", "image_encoder.memory_size=12", "text_encoder.embedding_size=8", "text_encoder.hidden_size=6",
    "decoder.embedding_size=8", "decoder.hidden_size=12", "decoder.attention_size=8", "decoder.style=bahdanau",
    "decoder.score=additive", "train.batch_size=4", "train.valid_max_examples=4", "search.beam_size=1",
]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_environment(rank: int, world: int, port: int) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )


def _train_worker(rank: int, world: int, port: int, task: str, overrides: list[str], report: str, resume: str) -> None:
    """One rank: train as ``overrides`` say; writes what it printed and its feature-cache counts to ``report``-<rank>.json."""
    faulthandler.enable()  # a rank that dies on a signal prints where, into the test's captured output
    _rank_environment(rank, world, port)
    torch.set_num_threads(1)
    from attnkit.captioning import train_captioning
    from attnkit.data.features import FeatureCache
    from attnkit.multitask import train_multitask
    from attnkit.translation import train_translation

    cache_counts = {"hits": 0, "misses": 0}
    compute = FeatureCache.get
    caches = {}  # the training set's cache and validation's (which keeps its features in memory), each counted

    def counting_get(self, *args, **kwargs):
        features = compute(self, *args, **kwargs)
        caches[id(self)] = self
        cache_counts.update(hits=sum(c.stats.hits for c in caches.values()), misses=sum(c.stats.misses for c in caches.values()))
        return features

    FeatureCache.get = counting_get
    from attnkit.train import Trainer

    fit, trained = Trainer.fit, {}

    def fit_and_sum_weights(self):  # each rank's weights after training, summed: equal ranks stayed in step
        progress = fit(self)
        trained["weights"] = float(sum(p.detach().double().sum() for p in self.model.parameters()))
        trained["steps"] = progress.step
        return progress

    Trainer.fit = fit_and_sum_weights
    printed: list[str] = []
    train = {"translation": train_translation, "captioning": train_captioning, "multitask": train_multitask}[task]
    train(load_config(None, overrides), resume=load_checkpoint(resume) if resume else None, progress_bar=False, log=printed.append)
    Path(f"{report}-{rank}.json").write_text(json.dumps({"printed": printed, "cache": cache_counts, **trained}))
    end_process(0)  # as tasks/train.py ends a rank


def train_on_two_ranks(task: str, overrides: list[str], report: Path, resume: Path | None = None) -> list[dict]:
    mp.spawn(_train_worker, args=(2, free_port(), task, overrides, str(report), str(resume or "")), nprocs=2, join=True)
    return [json.loads(Path(f"{report}-{rank}.json").read_text()) for rank in range(2)]


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(path).model


def epochs_logged(run: Path) -> list[int]:
    return [json.loads(line)["epoch"] for line in (run / "log.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def small_toy(tmp_path_factory) -> Path:
    """The reversal task with 96 training pairs: three global batches of 32."""
    rng = random.Random(1)
    splits = {"train": [reverse_pair(rng) for _ in range(96)], "valid": [reverse_pair(rng) for _ in range(8)], "test": [reverse_pair(rng) for _ in range(8)]}
    return write_parallel_dataset(tmp_path_factory.mktemp("small-toy"), ("src", "tgt"), splits)


@pytest.mark.slow
@pytest.mark.parametrize("limit", ["train.batch_size", "train.batch_tokens"])
def test_two_ranks_of_batch_b_train_exactly_as_one_process_of_batch_2b(small_toy, tmp_path, limit):
    """Dropout off: every rank takes half of each global batch and the loss is normalised by the global batch's
    tokens, so the gradients (and after a few Adam steps, the weights) equal one process with twice the batch.
    With token batches too: the ranks cut the same global batches (2 x batch_tokens), so they take the same steps."""
    from attnkit.translation import train_translation

    common = [f"data.path={small_toy}", *LEARNS, "train.epochs=2", "train.device=cpu", "train.label_smoothing=0.1"]
    size = 16 if limit == "train.batch_size" else 60  # 60 tokens: about 10 of the toy's targets, 4 to 8 tokens long
    train_translation(load_config(None, [*common, f"{limit}={2 * size}", f"output_dir={tmp_path / 'one'}"]), progress_bar=False, log=lambda _: None)
    reports = train_on_two_ranks("translation", [*common, f"{limit}={size}", f"output_dir={tmp_path / 'two'}"], tmp_path / "report")

    one, two = weights(tmp_path / "one" / "last.pt"), weights(tmp_path / "two" / "last.pt")
    steps = load_checkpoint(tmp_path / "one" / "last.pt").training["progress"]["step"]
    assert reports[0]["steps"] == reports[1]["steps"] == steps  # every rank took the one process's steps
    assert steps == 6 if limit == "train.batch_size" else steps > 6  # 3 global batches x 2 epochs; 120 tokens hold fewer than 32 targets
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-5, msg=name)
    assert reports[1]["printed"] == [] and any("rank 0 of 2" in line for line in reports[0]["printed"])  # only rank 0 speaks
    logs = [[json.loads(line) for line in (tmp_path / run / "log.jsonl").read_text().splitlines()] for run in ("one", "two")]
    for key in ("train_loss", "train_ppl"):  # the logged figures are the global batch's too
        assert [r[key] for r in logs[1]] == pytest.approx([r[key] for r in logs[0]], rel=1e-3), key


@pytest.mark.slow
def test_translation_on_two_ranks_resumes_exactly_with_dropout(small_toy, tmp_path):
    """Each rank's random stream (dropout) is saved and restored: 1 epoch + resume = 2 epochs straight."""
    common = [f"data.path={small_toy}", *LEARNS, "text_encoder.dropout=0.3", "decoder.dropout=0.3", "train.batch_size=16", "train.device=cpu"]
    train_on_two_ranks("translation", [*common, "train.epochs=2", f"output_dir={tmp_path / 'straight'}"], tmp_path / "a")
    train_on_two_ranks("translation", [*common, "train.epochs=1", f"output_dir={tmp_path / 'resumed'}"], tmp_path / "b")
    resumed = tmp_path / "resumed"
    train_on_two_ranks("translation", [*common, "train.epochs=2", f"output_dir={resumed}"], tmp_path / "c", resume=resumed / "last.pt")

    straight = weights(tmp_path / "straight" / "last.pt")
    for name, tensor in weights(resumed / "last.pt").items():
        torch.testing.assert_close(tensor, straight[name], msg=name)
    assert epochs_logged(resumed) == [1, 2]
    assert len(load_checkpoint(resumed / "last.pt").training["rng"]) == 2  # one random state per rank


@pytest.fixture(scope="module")
def caption_images(tmp_path_factory) -> Path:
    return write_shape_images(tmp_path_factory.mktemp("caption-images"))


@pytest.fixture(scope="module")
def backbone_weights(tmp_path_factory) -> Path:
    """A local weights file: with it the backbone is 'pretrained', so its features are cached."""
    import torchvision

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("weights") / "resnet18.pth"
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), path)
    return path


@pytest.mark.slow
def test_captioning_on_two_ranks_computes_the_feature_cache_once(caption_images, backbone_weights, tmp_path):
    overrides = [
        f"data.path={caption_images}", f"output_dir={tmp_path / 'run'}", *TINY_CAPTIONING, "train.epochs=1", "train.device=cpu", "train.valid_max_examples=4",
        f"image_encoder.weights={backbone_weights}", f"data.feature_cache={tmp_path / 'cache'}",
    ]  # fmt: skip
    reports = train_on_two_ranks("captioning", overrides, tmp_path / "report")
    assert reports[0]["cache"]["misses"] == 12  # rank 0 computes every image ...
    assert reports[1]["cache"] == {"hits": 12, "misses": 0}  # ... and rank 1 reads them (it does not validate)
    assert epochs_logged(tmp_path / "run") == [1]


@pytest.mark.slow
def test_self_critical_training_on_two_ranks_keeps_the_ranks_in_step(caption_images, tmp_path):
    """Each rank samples its own captions; the gradients are averaged only if the sampling runs through the DDP
    wrapper's forward: both ranks end with the same weights, moved from the start's."""
    from attnkit.captioning import train_captioning

    common = [f"data.path={caption_images}", *TINY_CAPTIONING, "train.device=cpu", "train.valid_max_examples=4"]
    train_captioning(load_config(None, [*common, f"output_dir={tmp_path / 'xe'}", "train.epochs=1"]), progress_bar=False, log=lambda _: None)
    start = tmp_path / "xe" / "best.pt"
    scst = [*common, f"output_dir={tmp_path / 'scst'}", "train.epochs=1", "train.objective=scst", f"train.init_from={start}", "train.scst_samples=2", "train.batch_size=2"]
    reports = train_on_two_ranks("captioning", scst, tmp_path / "report")
    from attnkit.model import model_from_checkpoint

    started = float(sum(p.detach().double().sum() for p in model_from_checkpoint(load_checkpoint(start)).parameters()))
    assert reports[0]["weights"] == reports[1]["weights"] and abs(reports[0]["weights"] - started) > 1e-6
    (record,) = [json.loads(line) for line in (tmp_path / "scst" / "log.jsonl").read_text().splitlines()]
    assert record["step"] == 3 and "reward" in record["train_statistics"]  # 12 photos, 2 a rank: 3 steps of 4


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> Path:
    from attnkit.data.scenes import write_scene_dataset

    return write_scene_dataset(tmp_path_factory.mktemp("scenes"), {"train": 24, "valid": 4, "test": 4, "compositional": 4}, seed=0, size=32)


@pytest.mark.slow
def test_the_joint_model_trains_on_two_ranks(scenes, backbone_weights, tmp_path):
    """Every rank runs the same task in a step; the idle encoder is left out of the gradient reduction."""
    overrides = [
        f"data.path={scenes}/captions", f"data.text_path={scenes}/text", f"output_dir={tmp_path / 'run'}", *JOINT,
        "train.epochs=2", "train.device=cpu", f"image_encoder.weights={backbone_weights}", f"data.feature_cache={tmp_path / 'cache'}",
    ]  # fmt: skip
    reports = train_on_two_ranks("multitask", overrides, tmp_path / "report")
    assert epochs_logged(tmp_path / "run") == [1, 2]
    assert reports[1]["cache"]["misses"] == 0
    saved = load_checkpoint(tmp_path / "run" / "last.pt")
    assert saved.task == "multitask" and saved.training["progress"]["step"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("recipe, decoder_embedding", [("scenes_multitask", 16), ("scenes_transformer", 32)])
def test_torchrun_trains_resumes_and_evaluates_the_joint_model(scenes, tmp_path, recipe, decoder_embedding):
    """The command a user types (the scene recipe, made small; with the RNN and with the Transformer decoder):
    torchrun with two CPU processes, then --resume, then evaluate.py."""
    run, cache = tmp_path / "run", tmp_path / "cache"
    sets = [
        f"data.path={scenes}/captions", f"data.text_path={scenes}/text", f"data.feature_cache={cache}", f"output_dir={run}",
        "train.epochs=1", "train.batch_size=8", "train.valid_max_examples=4", "decoder.hidden_size=32", f"decoder.embedding_size={decoder_embedding}",
        "text_encoder.embedding_size=32", "image_encoder.memory_size=32",
    ]  # fmt: skip
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port())]
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}

    def run_command(*arguments: str) -> str:
        done = subprocess.run(arguments, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    printed = run_command(*torchrun, "tasks/train.py", "--config", f"tasks/configs/{recipe}.yaml", "--no-progress", *(f"--set={s}" for s in sets))
    assert printed.count("done after 1 epochs") == 1  # rank 0 alone prints
    printed = run_command(*torchrun, "tasks/train.py", "--no-progress", "--resume", str(run / "last.pt"), "--set", "train.epochs=2")
    assert "resuming after epoch 1" in printed and printed.count("done after 2 epochs") == 1
    assert epochs_logged(run) == [1, 2]
    scores = run_command(sys.executable, "tasks/evaluate.py", "--checkpoint", str(run / "best.pt"), "--task", "translate", "--split", "test")
    assert "bleu" in scores.lower()


@pytest.mark.parametrize(
    "world_size, teardown_runs", [("2", False), ("1", True), ("two", True)], ids=["a rank of two", "one process", "a malformed environment"]
)
def test_end_process_skips_the_teardown_only_for_a_rank_of_several(world_size, teardown_runs):
    """What was printed still arrives and the exit code is kept; only a rank of a several-process job skips the
    interpreter's teardown (here: an atexit handler)."""
    script = "import atexit; from attnkit.distributed import end_process; atexit.register(print, 'teardown'); print('trained'); end_process(3)"
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, "WORLD_SIZE": world_size}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3
    assert done.stdout.split() == (["trained", "teardown"] if teardown_runs else ["trained"])


def test_each_rank_takes_its_own_gpu_or_the_only_one_it_sees():
    """torchrun shows every process all the machine's GPUs (rank r takes cuda:r); a launcher that shows each process
    its own one (SLURM's --gpus-per-task=1) makes it cuda:0 for every rank; a rank without a GPU is one message."""
    second = Distributed(rank=1, world_size=2, local_rank=1, local_world_size=2)
    assert second.own_gpu(visible=2) == 1 and second.own_gpu(visible=1) == 0
    with pytest.raises(UserError, match="LOCAL_RANK 2 has no GPU of its own: this process sees 2 CUDA device"):
        Distributed(rank=2, world_size=3, local_rank=2, local_world_size=3).own_gpu(visible=2)


def test_ranks_that_would_share_a_gpu_are_one_message():
    """torchrun --nproc_per_node 2 on a one-GPU machine shows each rank one GPU, as SLURM's --gpus-per-task=1 does:
    only the ranks' GPUs compared across the job tell the two apart (else NCCL's "Duplicate GPU detected")."""
    assert shared_gpu_message(["GPU a on n1", "GPU b on n1", "GPU c on n2"]) is None
    message = shared_gpu_message(["GPU a on n1", "GPU b on n1", "GPU a on n1"])
    assert message == (
        "ranks 0 and 2 would both train on GPU a on n1: start at most one process per GPU "
        "(torchrun --nproc_per_node at most the machine's GPUs; with SLURM, one task per GPU)"
    )


def _gather_worker(rank: int, world: int, port: int, report: str) -> None:
    _rank_environment(rank, world, port)
    job = Distributed.from_environment()
    job.start(torch.device("cpu"))
    gathered = [job.gather_through_store("test", f"rank {rank}"), job.gather(rank)]  # the process group still works after it
    Path(f"{report}-{rank}.json").write_text(json.dumps(gathered))
    job.stop()


def test_every_rank_gathers_every_ranks_value_through_the_store(tmp_path):
    """The comparison of GPUs goes through the job's store (on CUDA, before NCCL's first collective)."""
    mp.spawn(_gather_worker, args=(2, free_port(), str(tmp_path / "report")), nprocs=2, join=True)
    for rank in (0, 1):
        assert json.loads((tmp_path / f"report-{rank}.json").read_text()) == [["rank 0", "rank 1"], [0, 1]]
    assert Distributed().gather_through_store("test", "alone") == ["alone"]


def _timeout_worker(rank: int, world: int, port: int, report: str) -> None:
    """Rank 0 works alone for longer than a step may wait (the others wait on the rank-0 group), then rank 1 stalls
    in a step's collective: rank 0's wait there must end with the step's limit."""
    import datetime
    import time

    from attnkit import distributed

    _rank_environment(rank, world, port)
    distributed.STEP_TIMEOUT = datetime.timedelta(seconds=2)
    job = Distributed.from_environment()
    job.start(torch.device("cpu"))
    found = {"rank_0_work": job.on_main(lambda: time.sleep(4) or "done")}  # past the step's limit: still waited for
    if rank == 1:
        time.sleep(8)  # stalled without dying
    started = time.monotonic()
    try:
        job.sum(torch.ones(1))
        found["step"] = "summed"
    except RuntimeError:
        found["step"] = "timed out"
    found["waited_s"] = time.monotonic() - started
    Path(f"{report}-{rank}.json").write_text(json.dumps(found))
    distributed.end_process(0)


@pytest.mark.slow
def test_a_stalled_rank_fails_a_step_in_minutes_while_rank_0s_own_work_may_take_hours(tmp_path):
    """Every collective waited 2 hours: a rank that stopped without dying (SIGSTOP, a stalled read) held the
    others that long. A step's collectives now wait STEP_TIMEOUT, the waits for rank 0's work their own limit."""
    ranks = mp.spawn(_timeout_worker, args=(2, free_port(), str(tmp_path / "report")), nprocs=2, join=False)
    try:
        ranks.join(timeout=60)
    finally:
        for process in ranks.processes:  # a rank still waiting (the fault this test is about) must not outlive it
            process.kill()
    rank_0 = json.loads((tmp_path / "report-0.json").read_text())
    assert rank_0["rank_0_work"] == "done"
    assert rank_0["step"] == "timed out" and rank_0["waited_s"] < 7
