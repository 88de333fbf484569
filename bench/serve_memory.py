"""How much memory ``attnkit serve`` takes when many clients send at once (issue 44: a page strangers cannot take down).

Run from the project root::

    python bench/serve_memory.py --checkpoint runs/demo/scenes/best.pt

It starts ``attnkit serve`` as a user does (its own process, on a free port of 127.0.0.1), warms it with one small
photo, then for each load sends every request of the load at once and reads the server's peak resident memory
(Linux's VmHWM, reset before each load through /proc/PID/clear_refs) against its memory before the load:

- ``pixels``: ``--clients`` uniform ``--side`` x ``--side`` PNGs (about 190 kB each at 7900, under the default
  ``--max-pixels``; each decodes to ``--side``² x 3 bytes);
- ``bodies``: ``--bodies`` bodies of ``--body-mb`` MB each (under the default 20 MB limit) that are not photos.

Human-readable lines first; the LAST line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from PIL import Image

from attnkit.cli import int_in_range, positive_int, positive_number
from attnkit.errors import UserError, run_cli
from machine import busy_cores, print_result, project_path

BOUNDARY = "attnkit-bench-boundary"


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="a checkpoint that captions (a joint or a captioning one)")
    parser.add_argument("--clients", type=positive_int, default=8, help="large photos sent at once")
    parser.add_argument("--side", type=int_in_range(1, 7999), default=7900, help="their width and height in pixels")
    parser.add_argument("--bodies", type=positive_int, default=6, help="large bodies that are not photos sent at once")
    parser.add_argument("--body-mb", type=positive_number, default=19.0, help="their size in MB")
    parser.add_argument("--serve-option", action="append", default=[], metavar="OPTION", help="passed to attnkit serve (e.g. --serve-option=--max-connections=4)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    if not Path(args.checkpoint).is_file():
        raise UserError(f"no checkpoint at {args.checkpoint}")
    busy = busy_cores()
    loads = {"pixels": [uniform_png(args.side)] * args.clients, "bodies": [b"\0" * round(args.body_mb * 1e6)] * args.bodies}
    result = measure_server(args.checkpoint, loads, args.serve_option)
    for name, load in result["loads"].items():
        print(f"{name}: {load['requests']} at once, answers {load['statuses']}, peak {load['peak_mb']} MB = {load['before_mb']} MB before + {load['rise_mb']} MB")
    return print_result({"benchmark": "serve_memory", "checkpoint": project_path(args.checkpoint), "side": args.side, "body_mb": args.body_mb, **result}, busy)


def measure_server(checkpoint: str, loads: dict[str, list[bytes]], serve_options: list[str] = ()) -> dict:
    """Start ``attnkit serve`` on ``checkpoint``, warm it, send each load's bodies (as the ``photo`` field) at once;
    for each load: the answers' statuses, memory before, peak during, and the rise, in MB."""
    server, url = start_server(checkpoint, list(serve_options))
    try:
        post_photo(url, uniform_png(64))  # the first request loads what the model work needs
        measured = {"model_mb": resident_mb(server.pid)[0]}
        results = {}
        for name, bodies in loads.items():
            before = resident_mb(server.pid)[0]
            reset_peak(server.pid)
            started = time.perf_counter()
            with ThreadPoolExecutor(len(bodies)) as pool:
                statuses = sorted(pool.map(lambda body: post_photo(url, body), bodies))
            peak = max(resident_mb(server.pid)[1], before)
            results[name] = {
                "requests": len(bodies), "statuses": statuses, "seconds": round(time.perf_counter() - started, 1),
                "before_mb": before, "peak_mb": peak, "rise_mb": round(peak - before, 1),
            }  # fmt: skip
        return {**measured, "loads": results}
    finally:
        server.terminate()
        server.wait(timeout=30)


def start_server(checkpoint: str, options: list[str]) -> tuple[subprocess.Popen, str]:
    """``attnkit serve`` on a free port of 127.0.0.1, as its own process; the process and the page's URL."""
    command = [sys.executable, "-m", "attnkit", "serve", "--checkpoint", checkpoint, "--port", "0", "--device", "cpu", "--quiet", *options]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    line = server.stdout.readline()  # "attnkit serve: ...; open http://127.0.0.1:PORT/ (Ctrl-C stops)"
    if "http://" not in line:
        server.kill()
        raise UserError(f"attnkit serve did not start (exit {server.wait()}): {line.strip() or 'no output'}")
    return server, "http://" + line.split("http://", 1)[1].split()[0]


def resident_mb(pid: int) -> tuple[float, float]:
    """A process's resident memory now and its peak since the last reset (VmRSS, VmHWM), in MB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return tuple(round(int(fields[key].split()[0]) / 1000, 1) for key in ("VmRSS", "VmHWM"))


def reset_peak(pid: int) -> None:
    """Make VmHWM start again from the memory now (Linux: writing 5 to clear_refs)."""
    with open(f"/proc/{pid}/clear_refs", "w") as control:
        control.write("5")


def uniform_png(side: int) -> bytes:
    """A black ``side`` x ``side`` RGB PNG: tiny to send (compressed), ``side``² x 3 bytes once decoded."""
    buffer = io.BytesIO()
    Image.new("RGB", (side, side)).save(buffer, format="PNG")
    return buffer.getvalue()


def post_photo(url: str, photo: bytes) -> int:
    """POST ``photo`` as the page's form does; the answer's status."""
    head = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="photo"; filename="photo.png"\r\nContent-Type: image/png\r\n\r\n'.encode()
    body = head + photo + f"\r\n--{BOUNDARY}--\r\n".encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"})
    try:
        with urllib.request.urlopen(request, timeout=600) as answer:
            answer.read()
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


if __name__ == "__main__":
    sys.exit(run_cli(main))
