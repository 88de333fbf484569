"""A page to try a model without a shell (``attnkit serve``): drop a photo and/or type a sentence, get the caption
and the translation with their attention, and, when the model does both, the comparison view the HTML report
draws (:func:`attnkit.report.render_report`: per-word maps, source weights, the head and importance switches).

The server is Python's own (``http.server``, one thread per request); model work runs one request at a time
(a lock), so two requests at once are answered one after the other. It answers ``GET /`` (the form) and
``POST /`` (a ``multipart/form-data`` form with the fields ``photo`` and ``sentence``) and nothing else: no
request names a file on the server, and the only bytes it reads are the request's. A bad upload (not an
image, too large, too many pixels, no photo and no sentence, a sentence of unknown words) gets its message
on the page with status 400 (413 for too large), and the server stays up.
"""

from __future__ import annotations

import base64
import html
import tempfile
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from attnkit.captioning import Captioner, draw_caption_attention
from attnkit.comparison import AttentionComparer
from attnkit.data.images import MAX_PIXELS, rgb_from_bytes
from attnkit.errors import UserError
from attnkit.report import STYLE, render_report
from attnkit.translation import Translator, draw_translation_attention

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
    def from_checkpoints(cls, checkpoint: str | None = None, captioning: str | None = None, translation: str | None = None, device: str = "auto") -> "Models":
        """One checkpoint (joint: both; captioning or translation: one), or a captioning and a translation checkpoint."""
        from attnkit.checkpoint import load_checkpoint
        from attnkit.model import model_from_checkpoint

        if checkpoint is None:
            if captioning is None and translation is None:
                raise UserError("give --checkpoint, or --caption-checkpoint and/or --translation-checkpoint")
            return cls(
                Captioner.from_checkpoint(captioning, device=device) if captioning else None,
                Translator.from_checkpoint(translation, device=device) if translation else None,
            )
        if captioning is not None or translation is not None:
            raise UserError("give --checkpoint, or --caption-checkpoint and/or --translation-checkpoint, not both")
        loaded = load_checkpoint(checkpoint)
        model = model_from_checkpoint(loaded)  # built once: a joint model's two faces share it
        kinds = set(model.encoders)
        return cls(
            Captioner.from_checkpoint(loaded, device=device, model=model) if "image" in kinds else None,
            Translator.from_checkpoint(loaded, device=device, model=model) if "text" in kinds else None,
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
        try:
            found = parse_qs(body.decode("ascii"), keep_blank_values=True, strict_parsing=False, encoding="utf-8", errors="strict")
        except (UnicodeDecodeError, ValueError):
            raise BadRequest("the form is not valid URL-encoded UTF-8") from None
        return {name: (values[0].encode("utf-8"), None) for name, values in found.items()}
    if kind != "multipart/form-data":
        raise BadRequest("send the form as multipart/form-data (the page's form does)")
    message = BytesParser(policy=HTTP).parsebytes(b"Content-Type: " + content_type.encode("latin-1") + b"\r\nMIME-Version: 1.0\r\n\r\n" + body)
    if not message.is_multipart():
        raise BadRequest("the form could not be read (a multipart body without its parts)")
    fields = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if name:
            fields[name] = (part.get_payload(decode=True) or b"", part.get_filename())
    return fields


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
        self.lock = threading.Lock()  # one request's model work at a time

    def form(self, error: str = "", sentence: str = "") -> str:
        escape = html.escape
        photo = "" if self.models.captioner is None else (
            '<label class="drop" id="drop">Drop a photo here, or choose one: <input type="file" name="photo" id="photo" accept="image/*"></label><br>'
        )  # fmt: skip
        text = "" if self.models.translator is None else (
            f'<label>Sentence: <input type="text" name="sentence" id="sentence" value="{escape(sentence)}" autocomplete="off"></label><br>'
        )  # fmt: skip
        message = f'<p class="error" id="error">{escape(error)}</p>' if error else ""
        limits = f"photos up to {self.max_upload_bytes / 1e6:g} MB and {self.max_pixels / 1e6:g} M pixels"
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

    def answer(self, fields: dict[str, tuple[bytes, str | None]]) -> str:
        """The page for a submitted form (raises BadRequest / UserError with what to tell the user)."""
        photo, name = fields.get("photo", (b"", None))
        try:
            sentence = fields.get("sentence", (b"", None))[0].decode("utf-8").strip()
        except UnicodeDecodeError:
            raise BadRequest("the sentence is not UTF-8 text") from None
        if not photo and not sentence:
            raise BadRequest("drop a photo or type a sentence (or both)")
        if photo and self.models.captioner is None:
            raise BadRequest("this model does not caption photos (it has no image encoder)")
        if sentence and self.models.translator is None:
            raise BadRequest("this model does not translate sentences (it has no text encoder)")
        image = rgb_from_bytes(photo, name or "the photo", self.max_pixels) if photo else None  # ImageError: a UserError
        with self.lock:
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
                return render_report(image, comparison, comparison.statistics(), preamble=self.form(sentence=sentence) + summary)
            pictures = "".join(f'<img class="figure" src="{_png_data_url(path)}" alt="attention">' for path in figures)
        return self.page(results=summary + pictures, sentence=sentence)


def make_server(page: TryPage, host: str = "127.0.0.1", port: int = 8000, log: Callable[[str], None] | None = None) -> ThreadingHTTPServer:
    """A server for ``page`` on ``host:port`` (port 0: any free one); ``serve_forever()`` runs it."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "attnkit"

        def log_message(self, format: str, *args) -> None:  # noqa: A002  (BaseHTTPRequestHandler's name)
            if log is not None:
                log(f"{self.address_string()} {format % args}")

        def _send(self, status: int, document: str) -> None:
            body = document.encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if urlsplit(self.path).path != "/":
                return self._send(404, page.page(error=f"no page {urlsplit(self.path).path} here; the page is /"))
            self._send(200, page.page())

        def do_POST(self) -> None:
            if urlsplit(self.path).path != "/":
                return self._send(404, page.page(error="send the form to /"))
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                self.close_connection = True
                return self._send(411, page.page(error="the request has no length (Content-Length)"))
            if length > page.max_upload_bytes:
                self._discard(length)
                return self._send(413, page.page(error=f"the upload is {length / 1e6:.1f} MB, over the limit of {page.max_upload_bytes / 1e6:g} MB"))
            try:
                fields = form_fields(self.headers.get("Content-Type", ""), self.rfile.read(length))
                document, status = page.answer(fields), 200
            except BadRequest as error:
                document, status = page.page(error=str(error)), error.status
            except UserError as error:  # an image that cannot be used, ...
                document, status = page.page(error=str(error)), 400
            except Exception as error:  # the server stays up; the page and the log say what failed
                traceback.print_exc()
                document, status = page.page(error=f"the model failed on this input ({type(error).__name__}: {error})"), 500
            self._send(status, document)

        def _discard(self, length: int) -> None:
            """Read an oversized body away (up to 64 MB) so the client gets the answer, then close the connection."""
            self.close_connection = True
            left = min(length, 64_000_000)
            while left > 0 and (chunk := self.rfile.read(min(left, 1 << 20))):
                left -= len(chunk)

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server
