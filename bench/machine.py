"""What every benchmark reports about the machine it ran on (imported by the scripts in bench/)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import time
from pathlib import Path

import torch

from attnkit.distributed import usable_cores


def processor_name() -> str:
    name = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return name or platform.machine()


def busy_cores(seconds: float = 1.0) -> float | None:
    """Cores kept busy by other work during ``seconds`` before we start (from /proc/stat); None where unknown."""

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


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def project_path(path: str) -> str:
    """``path`` relative to the project root when it lies inside it (run-independent), else as given."""
    root = Path(__file__).resolve().parents[1]
    return str(Path(path).relative_to(root)) if Path(path).is_relative_to(root) else path


def print_result(result: dict, busy_before: float | None) -> int:
    """The benchmark's last line: its figures plus the load before it started, the machine and the date."""
    print(json.dumps({**result, "busy_cores_before": busy_before, "machine": machine_info(), "date": utc_now()}))
    return 0
