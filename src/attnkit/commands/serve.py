"""Serve a local page to try a model: drop a photo and/or type a sentence, get the caption and the translation
with their attention, and with a model that does both, the comparison report (maps per word, source weights,
the head and importance switches).

    attnkit serve --checkpoint runs/demo/scenes/best.pt            # a joint model: captions, translates, compares
    attnkit serve --checkpoint runs/multi30k_de_en_subword/best.pt   # a translator alone (or a captioner alone)
    attnkit serve --caption-checkpoint runs/flickr8k/best.pt --translation-checkpoint runs/multi30k_de_en/best.pt

then open the address it prints (http://127.0.0.1:8000/ by default). It listens on 127.0.0.1 only, unless
``--host`` says otherwise (``--host 0.0.0.0``: every network the machine is on; anyone who reaches it can use
the model). Ctrl-C or SIGTERM stops it: the request under way is answered first, any queued one is answered 503. Bad uploads get their message on the page and the server stays up.
"""

from __future__ import annotations

import argparse
import errno
import sys
from collections.abc import Sequence

from attnkit.cli import GivenOnce, add_device_arguments, int_in_range, positive_number, seconds, warn_slow_decoding
from attnkit.data.images import MAX_PIXELS
from attnkit.errors import UserError
from attnkit.serve import MAX_CONNECTIONS, SOCKET_TIMEOUT, Models, TryPage, make_server


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnkit serve", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", action=GivenOnce, help="a joint checkpoint (captions and translates), or a captioning or a translation checkpoint")
    parser.add_argument("--caption-checkpoint", action=GivenOnce, help="instead of --checkpoint: a captioning checkpoint (with --translation-checkpoint: compare too)")
    parser.add_argument("--translation-checkpoint", action=GivenOnce, help="instead of --checkpoint: a translation checkpoint")
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int_in_range(0, 65535), default=8000, help="the port (default 8000; 0: any free one; the address is printed)")
    parser.add_argument("--max-upload-mb", type=positive_number, default=20.0, help="largest request accepted, in MB (default %(default)g)")
    parser.add_argument("--max-pixels", type=int_in_range(1), default=MAX_PIXELS, help="largest photo accepted, in pixels (width x height; default %(default)s)")
    parser.add_argument("--max-connections", type=int_in_range(1), default=MAX_CONNECTIONS, help="connections served at once (default %(default)s); one more is answered 503 (busy)")
    parser.add_argument("--timeout", type=seconds, default=SOCKET_TIMEOUT, help="seconds a client may keep the server waiting in a read or a write (default %(default)g)")
    parser.add_argument("--no-importance", action="store_true", help="compare without the importance maps (faster: a backbone pass per grid cell saved)")
    add_device_arguments(parser)
    parser.add_argument("--quiet", action="store_true", help="no line per request")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    models = Models.from_checkpoints(args.checkpoint, args.caption_checkpoint, args.translation_checkpoint, device=args.device, precision=args.precision)
    warn_slow_decoding(models.captioner, models.translator)
    page = TryPage(models, max_upload_bytes=max(1, round(args.max_upload_mb * 1e6)), max_pixels=args.max_pixels, importance=not args.no_importance)
    try:
        server = make_server(
            page, args.host, args.port, log=None if args.quiet else lambda line: print(line, file=sys.stderr), max_connections=args.max_connections, timeout=args.timeout
        )
    except OSError as error:
        hint = "choose another --port, or 0 for any free one" if error.errno == errno.EADDRINUSE else "check --host: an address of this machine, e.g. 127.0.0.1 or ::1"
        raise UserError(f"cannot listen on {args.host} port {args.port}: {error.strerror or error} ({hint})") from None
    host, port = server.server_address[:2]
    shown = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    print(f"attnkit serve: this model {models.describe()}; open http://{f'[{shown}]' if ':' in shown else shown}:{port}/ (Ctrl-C stops)", flush=True)
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: listening on {host}: anyone who can reach this machine on port {port} can use the model", file=sys.stderr)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopping (a request under way is answered first)", file=sys.stderr, flush=True)
    finally:
        server.stop()
    print("stopped", file=sys.stderr)
    return 0

