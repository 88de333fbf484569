"""A page to try a model without a shell (``attnkit serve``): drop a photo and/or type a sentence, get the caption
and the translation with their attention, and, when the model does both, the comparison view the HTML report
draws (:func:`attnkit.report.render_report`: per-word maps, source weights, the head and importance switches).

The server is Python's own (``http.server``, one thread per connection, at most ``max_connections``); a
request's parse, photo decoding and model work run in one worker thread, one request at a time, so two requests
at once are answered one after the other and memory holds one request's work (:func:`make_server`). It answers ``GET /`` (the form) and
``POST /`` (a ``multipart/form-data`` form with the fields ``photo`` and ``sentence``) and nothing else: no
request names a file on the server, and the only bytes it reads are the request's. A bad upload (not an
image, too large, too many pixels, no photo and no sentence, a sentence of unknown words) gets its message
on the page with status 400 (413 for too large), and the server stays up.
"""

from __future__ import annotations

import base64
import contextlib
import html
import io
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError, ThreadPoolExecutor
from dataclasses import dataclass
from email.message import Message
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import BinaryIO
from urllib.parse import parse_qs, urlsplit

from attnkit.captioning import Captioner, draw_caption_attention
from attnkit.comparison import AttentionComparer
from attnkit.data.images import MAX_PIXELS, rgb_from_bytes
from attnkit.errors import UserError
from attnkit.report import STYLE, render_report
from attnkit.translation import Translator, draw_translation_attention

MAX_CONNECTIONS = 16  # connections served at once; one more is answered 503
SOCKET_TIMEOUT = 30.0  # seconds a read or a write may wait on a client
MIN_UPLOAD_BYTES_PER_S = 100_000  # an upload slower than this (past the timeout) is cut: it holds a connection
SPOOL_IN_MEMORY = 1 << 20  # a waiting body's bytes kept in memory; the rest waits on disk
CHUNK_BYTES = 1 << 16
LINGER_SECONDS = 2.0  # after a refusal, what the client still sends is read away this long before the close
MAX_PARTS, MAX_PART_HEADER_BYTES = 16, 16_384  # the page's form has two parts with a line of header each
MAX_SENTENCE_CHARACTERS = 5_000  # a paragraph; a translator reads its first data.max_source_length words of it
BUSY_TEXT = b"The page is busy: try again in a moment.\n"
BUSY_ANSWER = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nRetry-After: 5\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(BUSY_TEXT), BUSY_TEXT)
)

FORM_STYLE = """
.try { border: 1px solid #bbb; border-radius: 6px; padding: 0.8em 1em; margin-bottom: 1.2em; background: #fafafa; }
.drop { display: inline-block; border: 2px dashed #999; border-radius: 6px; padding: 1em 1.5em; margin: 0.3em 0; }
.drop.over { border-color: #2a6edb; background: #e3ecfb; }
input[type=text] { width: 40em; max-width: 100%; font-size: 1em; padding: 0.3em; }
.error { color: #a00; font-weight: bold; }
.result { font-size: 1.1em; margin: 0.3em 0; }
.figure { max-width: 100%; border: 1px solid #ccc; margin: 0.5em 0; }
"""
DROP_SCRIPT = """
const drop = document.getElementById('drop'), input = document.getElementById('photo');
['dragenter', 'dragover'].forEach(kind => drop.addEventListener(kind, event => { event.preventDefault(); drop.classList.add('over'); }));
['dragleave', 'drop'].forEach(kind => drop.addEventListener(kind, () => drop.classList.remove('over')));
drop.addEventListener('drop', event => { event.preventDefault(); input.files = event.dataTransfer.files; });
"""


class BadRequest(UserError):
    """A request the page answers with its message (``status``: 400, or 413 for too large)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Models:
    """What the page can do: caption (a captioner), translate (a translator), and compare when it has both."""

    captioner: Captioner | None
    translator: Translator | None

    @classmethod
    def from_checkpoints(
        cls, checkpoint: str | None = None, captioning: str | None = None, translation: str | None = None, device: str = "auto", precision: str = "checkpoint"
    ) -> "Models":
        """One checkpoint (joint: both; captioning or translation: one), or a captioning and a translation checkpoint;
        ``precision``: what they decode in (:func:`attnkit.distributed.decoding_precision`)."""
        from attnkit.checkpoint import load_checkpoint
        from attnkit.model import model_from_checkpoint

        if checkpoint is None:
            if captioning is None and translation is None:
                raise UserError("give --checkpoint, or --caption-checkpoint and/or --translation-checkpoint")
            return cls(
                Captioner.from_checkpoint(captioning, device=device, precision=precision) if captioning else None,
                Translator.from_checkpoint(translation, device=device, precision=precision) if translation else None,
            )
        if captioning is not None or translation is not None:
            raise UserError("give --checkpoint, or --caption-checkpoint and/or --translation-checkpoint, not both")
        loaded = load_checkpoint(checkpoint)
        model = model_from_checkpoint(loaded)  # built once: a joint model's two faces share it
        kinds = set(model.encoders)
        return cls(
            Captioner.from_checkpoint(loaded, device=device, model=model, precision=precision) if "image" in kinds else None,
            Translator.from_checkpoint(loaded, device=device, model=model, precision=precision) if "text" in kinds else None,
        )

    @property
    def comparer(self) -> AttentionComparer | None:
        return AttentionComparer(self.captioner, self.translator) if self.captioner and self.translator else None

    def describe(self) -> str:
        can = [what for what, model in (("captions photos", self.captioner), ("translates sentences", self.translator)) if model is not None]
        return " and ".join(can) + ("; with both, it compares the two attentions" if len(can) == 2 else "")


def form_fields(content_type: str, body: bytes) -> dict[str, tuple[bytes, str | None]]:
    """A POSTed form's fields: name -> (bytes, the file name for an upload)."""
    kind = content_type.split(";")[0].strip().lower()
    if kind == "application/x-www-form-urlencoded":
        if body.count(b"&") >= MAX_PARTS:  # as a multipart form's parts: 6 million empty fields in 20 MB cost about 1 GB
            raise BadRequest(f"the form has more than {MAX_PARTS} fields (the page's form has two)")
        try:
            found = parse_qs(body.decode("ascii"), keep_blank_values=True, strict_parsing=False, encoding="utf-8", errors="strict", max_num_fields=MAX_PARTS)
        except (UnicodeDecodeError, ValueError):
            raise BadRequest("the form is not valid URL-encoded UTF-8") from None
        return {name: (values[0].encode("utf-8"), None) for name, values in found.items()}
    if kind != "multipart/form-data":
        raise BadRequest("send the form as multipart/form-data (the page's form does)")
    header = Message()
    header["Content-Type"] = content_type
    boundary = header.get_param("boundary")
    if not isinstance(boundary, str) or not 0 < len(boundary) <= 70:  # RFC 2046: 1 to 70 characters
        raise BadRequest("the form could not be read (multipart/form-data without a boundary)")
    return multipart_fields(body, boundary.encode("latin-1"))


def multipart_fields(body: bytes, boundary: bytes) -> dict[str, tuple[bytes, str | None]]:
    """The parts of a ``multipart/form-data`` body (RFC 7578), read in place: each field's bytes are one slice of
    ``body``, so the form costs about its own size again (``email``'s parser held about ten times the body)."""
    first, delimiter = b"--" + boundary, b"\r\n--" + boundary
    if body.startswith(first):
        position = len(first)
    elif (found := body.find(delimiter)) >= 0:  # after a preamble
        position = found + len(delimiter)
    else:
        raise BadRequest("the form could not be read (a multipart body without its parts)")
    fields: dict[str, tuple[bytes, str | None]] = {}
    parts = 0  # every part counts, named alike or not: 100,000 parts named "a" once held the one worker for 23 s
    while not body.startswith(b"--", position):  # "--boundary--" closes the form
        parts += 1
        line_end = body.find(b"\r\n", position)  # the rest of the delimiter's line (transport padding)
        headers_end = body.find(b"\r\n\r\n", line_end) if line_end >= 0 else -1
        content_end = body.find(delimiter, headers_end + 4) if headers_end >= 0 else -1
        if content_end < 0 or headers_end - line_end > MAX_PART_HEADER_BYTES or parts > MAX_PARTS:
            raise BadRequest("the form could not be read (a part without its end, too long a header or too many parts)")
        headers = BytesParser(policy=HTTP).parsebytes(body[line_end + 2 : headers_end + 4], headersonly=True)
        name = headers.get_param("name", header="content-disposition")
        if isinstance(name, str) and name:
            fields[name] = (body[headers_end + 4 : content_end], headers.get_filename())
        position = content_end + len(delimiter)
    return fields


def size_text(count: float) -> str:
    """A number of bytes in the unit that shows it: 950 B, 50 kB, 1.5 MB, 2 GB (powers of 1000, as the option's MB)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count:.0f} B"


def _read_from_start(file: BinaryIO) -> bytes:
    file.seek(0)
    return file.read()


def _png_data_url(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


class TryPage:
    """The page's answers; HTTP is :func:`make_server`'s."""

    def __init__(self, models: Models, max_upload_bytes: int = 20_000_000, max_pixels: int = MAX_PIXELS, importance: bool = True):
        self.models = models
        self.comparer = models.comparer
        self.max_upload_bytes = max_upload_bytes
        self.max_pixels = max_pixels
        self.importance = importance
        # One thread does every request's parse, decode and model work, one request at a time. One thread, not a lock
        # shared by the connections' threads: the C allocator keeps a pool per thread, and what a decoded photo
        # freed in each pool stayed taken, so memory grew with the clients that had ever sent one.
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="attnkit-model")

    def form(self, error: str = "", sentence: str = "") -> str:
        escape = html.escape
        photo = "" if self.models.captioner is None else (
            '<label class="drop" id="drop">Drop a photo here, or choose one: <input type="file" name="photo" id="photo" accept="image/*"></label><br>'
        )  # fmt: skip
        text = "" if self.models.translator is None else (
            f'<label>Sentence: <input type="text" name="sentence" id="sentence" value="{escape(sentence)}" autocomplete="off"></label><br>'
        )  # fmt: skip
        message = f'<p class="error" id="error">{escape(error)}</p>' if error else ""
        limits = f"photos up to {size_text(self.max_upload_bytes)} and {self.max_pixels / 1e6:g} M pixels"
        return (
            f'<div class="try"><p>This model {escape(self.models.describe())}.</p>{message}'
            f'<form method="post" action="/" enctype="multipart/form-data">{photo}{text}'
            f'<button type="submit" id="go">Go</button> <small>({limits})</small></form></div>'
            f"<script>{DROP_SCRIPT if photo else ''}</script>"
        )

    def page(self, error: str = "", results: str = "", sentence: str = "") -> str:
        return (
            f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>attnkit: try a model</title><style>{STYLE}{FORM_STYLE}</style></head>'
            f"<body><h1>attnkit: try a model</h1>{self.form(error, sentence)}{results}</body></html>\n"
        )

    def answer_form(self, content_type: str, body: BinaryIO) -> str:
        """The page for a POSTed form whose body waits in ``body`` (spooled to disk past a megabyte). Its parse,
        the photo's decoding and the model work run one request at a time, so the memory they take is one request's
        however many clients send at once (raises BadRequest / UserError with what to tell the user)."""
        stopping = BadRequest("the server is stopping: send the form again once it is back", status=503)
        try:
            work = self.worker.submit(lambda: self.answer(form_fields(content_type, _read_from_start(body))))
        except RuntimeError:  # the worker was shut down: the server is stopping
            raise stopping from None
        try:
            return work.result()
        except CancelledError:  # it was still queued when the server began to stop
            raise stopping from None

    def stop(self) -> None:
        """Finish the request being worked on; each one still queued is answered 503 (the server is stopping)."""
        self.worker.shutdown(wait=True, cancel_futures=True)

    def answer(self, fields: dict[str, tuple[bytes, str | None]]) -> str:
        """The page for a submitted form's fields (run by the one worker: see :meth:`answer_form`)."""
        photo, name = fields.get("photo", (b"", None))
        try:
            sentence = fields.get("sentence", (b"", None))[0].decode("utf-8").strip()
        except UnicodeDecodeError:
            raise BadRequest("the sentence is not UTF-8 text") from None
        if not photo and not sentence:
            raise BadRequest("drop a photo or type a sentence (or both)")
        if len(sentence) > MAX_SENTENCE_CHARACTERS:  # split into words and each word drawn as typed: megabytes of it hold the worker
            raise BadRequest(f"the sentence is {len(sentence):,} characters long, over the page's {MAX_SENTENCE_CHARACTERS:,}")
        if photo and self.models.captioner is None:
            raise BadRequest("this model does not caption photos (it has no image encoder)")
        if sentence and self.models.translator is None:
            raise BadRequest("this model does not translate sentences (it has no text encoder)")
        image = rgb_from_bytes(photo, name or "the photo", self.max_pixels) if photo else None  # ImageError: a UserError
        return self._results(image, sentence)

    def _results(self, image, sentence: str) -> str:
        escape = html.escape
        lines, figures = [], []
        with tempfile.TemporaryDirectory() as folder:
            if image is not None:
                ((caption, *_),) = self.models.captioner.caption([image])
                if caption.error:
                    raise BadRequest(f"the photo: {caption.error}")
                lines.append(f'<p class="result"><b>caption</b>: <span id="caption">{escape(caption.text)}</span></p>')
                figures.append(draw_caption_attention(caption, image, Path(folder) / "caption.png"))
            if sentence:
                ((translation, *_),) = self.models.translator.translate([sentence])
                if translation.error:
                    raise BadRequest(f"the sentence: {translation.error}")
                cut = f" (the sentence was cut to the first {len(translation.source_words)} words the model reads)" if translation.truncated else ""
                lines.append(f'<p class="result"><b>translation</b>: <span id="translation">{escape(translation.text)}</span>{escape(cut)}</p>')
                figures.append(draw_translation_attention(translation, Path(folder) / "translation.png"))
            summary = "".join(lines)
            if image is not None and sentence and self.comparer is not None:
                comparison = self.comparer.compare([image], [sentence], None, heads=True, importance=self.importance)[0]
                for model, words in self.comparer.unknown_words(comparison.target_words[:-1]).items():  # a separate translator may lack caption words
                    if words:
                        summary += f'<p class="result">the {model} does not know {escape(" ".join(words))}: each such word is compared as &lt;unk&gt;</p>'
                return render_report(image, comparison, comparison.statistics(), preamble=self.form(sentence=sentence) + summary)
            pictures = "".join(f'<img class="figure" src="{_png_data_url(path)}" alt="attention">' for path in figures)
        return self.page(results=summary + pictures, sentence=sentence)


class _DeadlineReader(io.RawIOBase):
    """Reads a handler's socket, each read waiting at most the handler's timeout, and no later than its
    ``head_deadline`` while one is set (a request's line and headers). Past the deadline a read raises
    TimeoutError, which ``http.server`` answers by closing the connection."""

    def __init__(self, handler: BaseHTTPRequestHandler):
        self.handler = handler

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        wait = self.handler.timeout
        if self.handler.head_deadline is not None:
            wait = min(wait, self.handler.head_deadline - time.monotonic())
            if wait <= 0:
                raise TimeoutError("the request's head did not arrive within the timeout")
        self.handler.connection.settimeout(wait)
        return self.handler.connection.recv_into(buffer)


def make_server(
    page: TryPage,
    host: str = "127.0.0.1",
    port: int = 8000,
    log: Callable[[str], None] | None = None,
    max_connections: int = MAX_CONNECTIONS,
    timeout: float = SOCKET_TIMEOUT,
) -> ThreadingHTTPServer:
    """A server for ``page`` on ``host:port`` (port 0: any free one; an IPv6 host such as ``::1`` listens on IPv6);
    ``serve_forever()`` runs it.

    What a request can cost is bounded: at most ``max_connections`` connections are served at once (one more is
    answered 503 at once), a connection silent for ``timeout`` seconds, slower than that to send a request's line
    and headers, or slower than that to send its body is closed, a body goes to a spooled file (a megabyte in memory, the rest on disk) while it waits its turn, and only
    then, one request at a time, is it parsed, decoded and run (:meth:`TryPage.answer_form`).
    """
    say = log or (lambda line: None)

    class Handler(BaseHTTPRequestHandler):
        server_version = "attnkit"

        def setup(self) -> None:
            self.timeout = timeout  # StreamRequestHandler sets it on the socket: no read or write waits longer
            super().setup()
            self.rfile.close()  # the socket's own reader, replaced by one that knows the head's deadline
            self.head_deadline: float | None = None
            self.rfile = io.BufferedReader(_DeadlineReader(self), CHUNK_BYTES)

        def handle_one_request(self) -> None:
            # A request's line and headers must all arrive within the timeout: a client that trickles them a byte
            # at a time (slowloris) would otherwise hold its connection for as long as it keeps trickling.
            self.head_deadline = time.monotonic() + timeout
            super().handle_one_request()

        def parse_request(self) -> bool:
            parsed = super().parse_request()
            self.head_deadline = None  # the head is read: a body has its own limits (_receive, _discard)
            self.connection.settimeout(timeout)  # the answer's writes get the whole timeout, not what the head left
            return parsed

        def handle(self) -> None:
            try:
                super().handle()
            except (ConnectionError, TimeoutError) as error:  # the client hung up or stalled: its answer has no reader
                say(f"{self.client_address[0]} gone before its answer ({type(error).__name__})")
                self.close_connection = True

        def log_message(self, format: str, *args) -> None:  # noqa: A002  (BaseHTTPRequestHandler's name)
            # A request line is the client's text: its escape sequences would retitle or clear the operator's terminal.
            say(f"{self.address_string()} {(format % args).translate(self._control_char_table)}")

        def _send(self, status: int, document: str) -> None:
            body = document.encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def _refuse(self, status: int, error: str) -> None:
            """Answer before reading the body (or after reading it away) and close: what is left unread is not ours."""
            self.close_connection = True
            self._send(status, page.page(error=error))
            self._linger()

        def _linger(self) -> None:
            """Close the way Apache's lingering close does: closing a socket with unread bytes in it sends a reset,
            which can reach a client still sending its body before our answer does, and destroys the answer there.
            So: the answer goes out, our side is shut (the client reads it to the end), and what the client still
            sends is read away for at most ``LINGER_SECONDS``, after which the connection is closed as before."""
            deadline = time.monotonic() + LINGER_SECONDS
            with contextlib.suppress(OSError):  # a client already gone has nothing to linger for
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_WR)
                while (left := deadline - time.monotonic()) > 0:
                    self.connection.settimeout(left)
                    if not self.connection.recv(CHUNK_BYTES):  # the client closed its side too
                        break

        def do_GET(self) -> None:
            with self.server.answering():
                if urlsplit(self.path).path != "/":
                    return self._send(404, page.page(error=f"no page {urlsplit(self.path).path} here; the page is /"))
                self._send(200, page.page())

        def do_POST(self) -> None:
            with self.server.answering():  # a stop waits for this answer to go out
                self._answer_post()

        def _answer_post(self) -> None:
            if urlsplit(self.path).path != "/":
                return self._refuse(404, "send the form to /")
            if "Transfer-Encoding" in self.headers:  # chunked bodies have no length to check first
                return self._refuse(411, "send the form with a Content-Length, not in chunks")
            declared = self.headers.get("Content-Length")
            if declared is None:
                return self._refuse(411, "the request has no length (Content-Length)")
            if not declared.isascii() or not declared.isdigit():  # int() would take "-1", "+5", " 7" and "1_000"
                return self._refuse(400, f"the request's length (Content-Length) is not a number of bytes: {declared[:40]!r}")
            length = int(declared)
            if length > page.max_upload_bytes:
                self._discard(length)
                return self._refuse(413, f"the upload is {size_text(length)}, over the limit of {size_text(page.max_upload_bytes)}")
            with tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY) as body:
                if not self._receive(length, body):
                    return self._refuse(408, f"the upload did not arrive within {timeout:g} s")
                try:
                    document, status = page.answer_form(self.headers.get("Content-Type", ""), body), 200
                except BadRequest as error:
                    document, status = page.page(error=str(error)), error.status
                except UserError as error:  # an image that cannot be used, ...
                    document, status = page.page(error=str(error)), 400
                except Exception as error:  # the server stays up; the page and the log say what failed
                    traceback.print_exc()
                    document, status = page.page(error=f"the model failed on this input ({type(error).__name__}: {error})"), 500
            self._send(status, document)

        def _receive(self, length: int, into: BinaryIO) -> bool:
            """Copy ``length`` bytes of body into ``into`` a chunk at a time; False if the client ends early or is too
            slow: past the first ``timeout`` seconds the body must have come at ``MIN_UPLOAD_BYTES_PER_S`` on average,
            checked at every chunk (a client that declares 20 MB and sends a byte every 25 s is cut after 30 s, not 200)."""
            start = time.monotonic()
            received = 0
            while received < length:
                try:
                    chunk = self.rfile.read1(min(length - received, CHUNK_BYTES))
                except TimeoutError:  # silent for the whole timeout
                    return False
                if not chunk or received + len(chunk) < (time.monotonic() - start - timeout) * MIN_UPLOAD_BYTES_PER_S:
                    return False
                into.write(chunk)
                received += len(chunk)
            return True

        def _discard(self, length: int) -> None:
            """Read an oversized body away (up to 64 MB, within the timeout) so that the client sees the answer rather
            than a reset; a client that trickles it holds its connection no longer than a slow upload would."""
            deadline = time.monotonic() + timeout
            left = min(length, 64_000_000)
            with contextlib.suppress(TimeoutError):  # silent for the whole timeout
                while left > 0 and time.monotonic() < deadline and (chunk := self.rfile.read1(min(left, CHUNK_BYTES))):
                    left -= len(chunk)

    class Server(ThreadingHTTPServer):
        daemon_threads = True  # an idle kept-alive connection does not hold the process up when it stops
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        slots = threading.BoundedSemaphore(max_connections)
        answers = threading.Condition()
        answers_under_way = 0

        @contextlib.contextmanager
        def answering(self) -> Iterator[None]:
            with self.answers:
                self.answers_under_way += 1
            try:
                yield
            finally:
                with self.answers:
                    self.answers_under_way -= 1
                    self.answers.notify_all()

        def stop(self) -> None:
            """Stop as a service should (Ctrl-C, SIGTERM): take no more connections, finish the request the model is
            working on and send its answer, answer each queued one 503, all within about ``timeout`` seconds
            after the model's work; then the process may exit (a temporary folder left by none)."""
            self.server_close()
            page.stop()
            with self.answers:
                self.answers.wait_for(lambda: self.answers_under_way == 0, timeout=timeout)

        def process_request(self, request, client_address) -> None:
            if not self.slots.acquire(blocking=False):  # full: say so now rather than queue without bound
                with contextlib.suppress(OSError):
                    request.sendall(BUSY_ANSWER)
                self.shutdown_request(request)
                say(f"{client_address[0]} answered 503: {max_connections} connections already in service")
                return
            super().process_request(request, client_address)

        def process_request_thread(self, request, client_address) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                self.slots.release()

        def handle_error(self, request, client_address) -> None:  # one line, not the traceback socketserver prints
            kind, error, _ = sys.exc_info()
            if isinstance(error, (ConnectionError, TimeoutError)):
                say(f"{client_address[0]} gone ({kind.__name__})")
            else:
                super().handle_error(request, client_address)

    return Server((host, port), Handler)
