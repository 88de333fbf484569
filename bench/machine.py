"""What every benchmark reports about the machine it ran on (imported by the scripts in bench/)."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import time
from pathlib import Path

import torch

from attnkit.distributed import usable_cores
from attnkit.errors import UserError
from attnkit.files import json_text

# The load sample before a benchmark and the calibration after it take about four seconds. The tests run the
# benchmarks end to end, many times, and set this variable (tests/conftest.py) to shorten both; a JSON line
# measured with it says so ("probe_scale" in its calibration), and no figure in BENCHMARKS.md is one.
PROBE_SCALE_VARIABLE = "ATTNKIT_PROBE_SCALE"


def probe_scale() -> float:
    """The factor on the load sample's and the calibration's durations: 1 unless the variable above says less."""
    text = os.environ.get(PROBE_SCALE_VARIABLE, "1")
    try:
        scale = float(text)
    except ValueError:
        scale = 0.0
    if not 0 < scale <= 1:
        raise UserError(f"{PROBE_SCALE_VARIABLE}={text!r}: give a number above 0 and at most 1 (the tests' shortening), or unset it")
    return scale


def add_device_argument(parser: argparse.ArgumentParser, default: str = "cpu") -> None:
    """``--device`` of a benchmark: resolve it with :func:`attnkit.distributed.resolve_device` at the start of
    ``main`` (a clear error for a CUDA device that is not there) and give the result to everything it runs."""
    parser.add_argument(
        "--device", default=default, help=f"cpu | cuda | cuda:N | auto (default: {default}, where this benchmark's recorded figures come from)"
    )


def processor_name() -> str:
    name = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return name or platform.machine()


def busy_cores(seconds: float | None = None) -> float | None:
    """Cores kept busy by other work during ``seconds`` (default: one second times :func:`probe_scale`) before we
    start (from /proc/stat); None where unknown."""
    seconds = probe_scale() if seconds is None else seconds

    def sample() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields[:8]), idle

    try:
        total_0, idle_0 = sample()
        time.sleep(seconds)
        total_1, idle_1 = sample()
    except (OSError, IndexError, ValueError):  # not Linux
        return None
    if total_1 == total_0:
        return None
    return round((1 - (idle_1 - idle_0) / (total_1 - total_0)) * (os.cpu_count() or 1), 2)


def machine_info() -> dict:
    """Processor, cores, accelerator and software versions, for the JSON line of a benchmark."""
    return {
        "processor": processor_name(),
        "arch": platform.machine(),
        "cpu_count": os.cpu_count(),
        "usable_cores": usable_cores(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "system": platform.platform(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


# The calibration: two small kernels whose speed stands for the machine's, measured at the benchmark's
# own thread count. A figure taken on another machine scales by their ratio (BENCHMARKS.md, "Comparing
# machines"): training and decoding speed follow the LSTM cell, large matrix work follows the matmul.
MATMUL_SIZE = 512  # float32 (n x n) @ (n x n)
CELL_SIZES = (64, 768, 512)  # batch, input, hidden: the Flickr8k recipe's decoder cell (embedding 256 + context 512 in)


def best_rate(work, units: float, seconds: float) -> float:
    """Units per second of ``work()``: the best of three rounds of about ``seconds`` / 3 each, after a warm-up."""
    work()
    start = time.perf_counter()
    work()
    once = max(time.perf_counter() - start, 1e-6)
    repeats = max(1, int(seconds / 3 / once))
    best = 0.0
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeats):
            work()
        best = max(best, repeats * units / (time.perf_counter() - start))
    return best


@torch.no_grad()
def calibrate(seconds: float | None = None) -> dict:
    """This machine's speed at the current torch thread count, in about ``seconds`` (default: three seconds times
    :func:`probe_scale`): float32 matmul GFLOP/s and LSTM cell steps/s (forward, one step of ``CELL_SIZES``)."""
    scale = 1.0  # a duration given outright is not the tests' shortening
    if seconds is None:
        scale = probe_scale()
        seconds = 3.0 * scale
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(MATMUL_SIZE, MATMUL_SIZE, generator=generator) for _ in range(2))
    batch, inputs, hidden = CELL_SIZES
    x, h, c = torch.randn(batch, inputs, generator=generator), torch.zeros(batch, hidden), torch.zeros(batch, hidden)
    w_ih, w_hh = torch.randn(4 * hidden, inputs, generator=generator) * 0.05, torch.randn(4 * hidden, hidden, generator=generator) * 0.05
    b_ih, b_hh = torch.zeros(4 * hidden), torch.zeros(4 * hidden)
    return {
        "threads": torch.get_num_threads(),
        "matmul_gflops": round(best_rate(lambda: torch.mm(a, b), 2 * MATMUL_SIZE**3 / 1e9, seconds / 2), 1),
        "lstm_cell_steps_per_s": round(best_rate(lambda: torch.lstm_cell(x, (h, c), w_ih, w_hh, b_ih, b_hh), 1, seconds / 2)),
        "lstm_cell_sizes": dict(zip(("batch", "input", "hidden"), CELL_SIZES)),
        **({"probe_scale": scale} if scale != 1 else {}),
    }


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def project_path(path: str) -> str:
    """``path`` relative to the project root when it lies inside it (run-independent), else as given."""
    root = Path(__file__).resolve().parents[1]
    return str(Path(path).relative_to(root)) if Path(path).is_relative_to(root) else path


def print_result(result: dict, busy_before: float | None) -> int:
    """The benchmark's last line: its figures plus the load before it started, the machine, its calibrated
    speed (measured now, once the benchmark's own work is done, at its thread count) and the date."""
    # json_text: strict JSON (a share of no cases, 0/0, is null, not the bare NaN that jq and JSON.parse refuse)
    print(json_text({**result, "busy_cores_before": busy_before, "machine": machine_info(), "calibration": calibrate(), "date": utc_now()}))
    return 0
