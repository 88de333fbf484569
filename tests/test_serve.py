"""attnkit serve: the page answers a good photo, a good sentence, both (the comparison report), each bad upload with
its message (and stays up), two requests at once, never a file on the server; in headless Chromium a dropped photo
and a typed sentence give the report, whose words switch the maps."""

import contextlib
import io
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from attnkit.commands import serve as serve_command
from attnkit.config import load_config
from attnkit.data.scenes import generate_scenes, write_scene_dataset
from attnkit.errors import run_cli
from attnkit.multitask import train_multitask
from attnkit.serve import BadRequest, Models, TryPage, form_fields, make_server, size_text

BOUNDARY = "attnkit-test-boundary"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def joint(tmp_path_factory):
    """A tiny joint model (one epoch on 24 generated scenes): it captions, translates and compares."""
    folder = tmp_path_factory.mktemp("joint")
    scenes = write_scene_dataset(folder / "scenes", {"train": 24, "valid": 4}, seed=0, size=64)
    config = load_config(None, [
        "task=multitask", f"data.path={scenes}/captions", f"data.text_path={scenes}/text", "data.tokenizer.kind=space",
        "image_encoder.backbone=resnet18", "image_encoder.weights=none", "image_encoder.image_size=64", "image_encoder.grid_size=2",
        "image_encoder.memory_size=16", "text_encoder.embedding_size=8", "text_encoder.hidden_size=8", "decoder.embedding_size=8",
        "decoder.hidden_size=16", "decoder.attention_size=8", "train.batch_size=16", "train.epochs=1", "train.device=cpu", f"output_dir={folder / 'run'}",
    ])  # fmt: skip
    train_multitask(config, progress_bar=False, log=lambda _: None)
    return folder / "run" / "best.pt"


@pytest.fixture(scope="module")
def models(joint):
    return Models.from_checkpoints(str(joint), device="cpu")


@pytest.fixture
def serving(models):
    """Start a server for a page (keyword options of TryPage) on a free port; its base URL."""
    servers = []

    def start(models=models, **options) -> str:
        server = make_server(TryPage(models, **options), "127.0.0.1", 0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return "http://127.0.0.1:{}/".format(server.server_address[1])

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n{} loop\n"  # Pillow's EPS reader would run it in Ghostscript


def scene_png() -> tuple[bytes, str]:
    (scene,) = generate_scenes(1, seed=0, split="test", size=64)
    buffer = io.BytesIO()
    scene.image().save(buffer, format="PNG")
    return buffer.getvalue(), scene.sentences[0].french_text


def post(url: str, photo: bytes | None = None, sentence: str = "", filename: str = "photo.png") -> tuple[int, str]:
    parts = []
    if photo is not None:
        parts.append(f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="photo"; filename="{filename}"\r\nContent-Type: application/octet-stream\r\n\r\n'.encode() + photo + b"\r\n")
    parts.append(f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="sentence"\r\n\r\n{sentence}\r\n'.encode())
    body = b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"})
    return fetch(request)


def fetch(request) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, answer.read().decode("utf-8")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode("utf-8")


def test_the_form_a_photo_a_sentence_and_both(serving):
    url = serving()
    status, page = fetch(url)
    assert status == 200 and 'name="photo"' in page and 'name="sentence"' in page and "captions photos and translates sentences" in page
    photo, french = scene_png()
    status, page = post(url, photo=photo)
    assert status == 200 and 'id="caption"' in page and 'id="translation"' not in page and "data:image/png;base64," in page
    status, page = post(url, sentence=french)
    assert status == 200 and 'id="translation"' in page and 'id="caption"' not in page
    status, page = post(url, photo=photo, sentence=french)
    assert status == 200 and 'id="caption"' in page and 'id="translation"' in page
    assert 'class="word"' in page and 'id="image-map"' in page and 'id="view"' in page  # the report: maps per word, the importance switch


def test_caption_words_a_separate_translator_lacks_are_said_on_the_page(serving, monkeypatch):
    from attnkit.comparison import AttentionComparer

    monkeypatch.setattr(AttentionComparer, "unknown_words", lambda self, words: {"captioner": [], "translator": [words[0], "<b>"]})
    photo, french = scene_png()
    status, page = post(serving(), photo=photo, sentence=french)
    assert status == 200 and "the translator does not know " in page and "&lt;b&gt;: each such word is compared as &lt;unk&gt;" in page
    assert "the captioner does not know" not in page


@pytest.mark.parametrize(
    ("upload", "options", "status", "message"),
    [
        (dict(photo=b"this is not a picture"), {}, 400, "not an image file"),
        (dict(photo=b""), {}, 400, "drop a photo or type a sentence"),
        (dict(photo=b"x" * 60_000), dict(max_upload_bytes=50_000), 413, "over the limit of 50 kB"),
        (dict(photo="scene"), dict(max_pixels=1000), 400, "64x64 pixels is over the limit of 1,000"),
        (dict(sentence="   "), {}, 400, "drop a photo or type a sentence"),
        (dict(sentence="zzz qqq xxyy"), {}, 400, "the sentence:"),
        (dict(photo=EPS), {}, 400, "not an image file in a format read here"),  # never handed to Ghostscript
        (dict(sentence="un " + "x" * 6_000), {}, 400, "the sentence is 6,003 characters long"),
    ],
    ids=["not-an-image", "empty-photo", "too-large", "too-many-pixels", "empty-text", "unknown-words", "postscript", "long-sentence"],
)
def test_each_bad_upload_gets_its_message_and_the_server_stays_up(serving, upload, options, status, message):
    url = serving(**options)
    if upload.get("photo") == "scene":
        upload["photo"] = scene_png()[0]
    got, page = post(url, **upload)
    assert got == status and message in page and 'class="error"' in page
    assert fetch(url)[0] == 200  # still up


def test_no_request_reads_a_file_on_the_server(serving):
    url = serving()
    for path in ("etc/passwd", "../../etc/passwd", "?file=/etc/passwd", "static/report.html"):
        status, page = fetch(url + path)
        assert status == (200 if path.startswith("?") else 404) and "root:" not in page
    status, page = post(url, sentence="/etc/passwd", photo=None)
    assert "root:" not in page  # a path is only a sentence to translate


def test_a_model_that_does_one_task_says_so(serving, models):
    url = serving(models=Models(captioner=None, translator=models.translator))
    photo, _ = scene_png()
    status, page = post(url, photo=photo)
    assert status == 400 and "does not caption photos" in page
    assert 'name="photo"' not in fetch(url)[1]  # and offers no photo field


def test_two_requests_at_once_are_both_answered(serving):
    url = serving()
    photo, french = scene_png()
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: post(url, photo=photo, sentence=french), range(2)))
    assert [status for status, _ in answers] == [200, 200] and all('class="word"' in page for _, page in answers)


def test_the_command_refuses_bad_options_with_one_message(capsys, tmp_path):
    assert run_cli(serve_command.main, ["--checkpoint", str(tmp_path / "missing.pt")]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert run_cli(serve_command.main, []) == 2
    assert "give --checkpoint" in capsys.readouterr().err
    for option, message in [
        (["--port", "70000"], "must be between 0 and 65535"),
        (["--max-upload-mb", "inf"], "must be a finite number"),
        (["--max-upload-mb", "nan"], "must be a finite number"),
        (["--timeout", "-1"], "must be greater than 0"),
        (["--max-connections", "0"], "must be at least 1"),
    ]:
        with pytest.raises(SystemExit):
            serve_command.get_args_parser().parse_args(["--checkpoint", "x", *option])
        assert f"argument {option[0]}: {message}" in capsys.readouterr().err


def test_a_stop_answers_the_request_under_way_and_each_queued_one_503(models, monkeypatch):
    page = TryPage(models)
    working, release = threading.Event(), threading.Event()
    answer = TryPage.answer
    monkeypatch.setattr(page, "answer", lambda fields: (working.set(), release.wait(60), answer(page, fields))[-1])
    server = make_server(page, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = "http://127.0.0.1:{}/".format(server.server_address[1])
    with ThreadPoolExecutor(3) as pool:
        under_way = pool.submit(post, url, sentence=scene_png()[1])
        assert working.wait(60)
        queued = pool.submit(post, url, sentence="un cercle")
        time.sleep(0.5)  # it waits behind the first in the model's queue
        server.shutdown()  # serve_forever returns (Ctrl-C in the command)
        stopping = pool.submit(server.stop)
        status, text = queued.result(60)
        assert status == 503 and "the server is stopping" in text and not under_way.done()
        release.set()
        stopping.result(60)
        status, text = under_way.result(60)
    assert status == 200 and 'id="translation"' in text


def test_sigterm_stops_the_command_once_the_request_under_way_is_answered(joint, tmp_path):
    """A service manager's stop killed the process at once: the request under way lost its answer and its
    temporary folder stayed behind."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    command = [sys.executable, "-m", "attnkit", "serve", "--checkpoint", str(joint), "--port", "0", "--device", "cpu"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(temporary)})
    try:
        url = re.search(r"open (http://\S+/)", server.stdout.readline()).group(1)
        photo, french = scene_png()
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(post, url, photo=photo, sentence=french)  # the comparison: a second or more of work
            deadline = time.monotonic() + 60
            while not any(temporary.iterdir()) and time.monotonic() < deadline:  # the request's folder: its work began
                time.sleep(0.01)
            server.send_signal(signal.SIGTERM)
            status, text = answer.result(120)
        assert status == 200 and 'class="word"' in text
        assert server.wait(60) == 0 and server.stderr.read().rstrip().endswith("stopped")
        assert list(temporary.iterdir()) == []
    finally:
        server.kill()
        server.wait()


def test_sizes_are_said_in_the_unit_that_shows_them():
    assert [size_text(n) for n in (0, 950, 1000, 50_000, 1_500_000, 20e6, 2.5e9)] == ["0 B", "950 B", "1 kB", "50 kB", "1.5 MB", "20 MB", "2.5 GB"]


def raw_exchange(url: str, request: bytes, then: bytes = b"", shut: bool = True) -> bytes:
    """Send ``request`` (and ``then``) on a socket of its own, half-close it, and read the whole answer."""
    host, port = url.split("//")[1].strip("/").rsplit(":", 1)
    with socket.create_connection((host.strip("[]"), int(port)), timeout=60) as connection:
        connection.sendall(request + then)
        if shut:
            connection.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize(("length", "status"), [("-1", 400), ("-2", 400), ("abc", 400), ("+5", 400), ("1_000", 400), (None, 411)])
def test_a_length_that_is_not_a_number_of_bytes_is_refused_before_the_body_is_read(serving, length, status):
    url = serving()
    head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\n"
    head += b"" if length is None else f"Content-Length: {length}\r\n".encode()
    started = time.perf_counter()
    # 16 MB: more than the socket buffers hold, so the client is still sending when the server answers and closes; the
    # answer must reach it all the same (the server lingers: it reads the rest away rather than reset the connection)
    answer = raw_exchange(url, head + b"\r\n", then=b"x" * 16_000_000, shut=False)
    assert answer.startswith(f"HTTP/1.0 {status}".encode()) and b"Content-Length" in answer and time.perf_counter() - started < 10
    assert fetch(url)[0] == 200


def test_a_client_that_hangs_up_costs_one_log_line_not_a_traceback(models, capfd):
    lines = []
    server = make_server(TryPage(models), "127.0.0.1", 0, log=lines.append)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = "http://127.0.0.1:{}/".format(server.server_address[1])
    try:
        for _ in range(5):  # a client that sends its request and goes: the answer meets a closed socket
            with socket.create_connection(("127.0.0.1", server.server_address[1])) as connection:
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")  # close with a reset
                connection.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert fetch(url)[0] == 200
        time.sleep(0.5)
    finally:
        server.shutdown()
        server.server_close()
    assert "Traceback" not in capfd.readouterr().err and all("\n" not in line for line in lines)


def test_connections_past_the_limit_are_answered_busy_and_a_stalled_one_is_cut(models):
    server = make_server(TryPage(models), "127.0.0.1", 0, max_connections=1, timeout=1.0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    url = f"http://127.0.0.1:{port}/"
    try:
        stalled = socket.create_connection(("127.0.0.1", port))
        stalled.sendall(b"POST / HTTP/1.1\r\nHost: x\r\n")  # half its headers, then silence: it holds the one connection
        time.sleep(0.2)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as another:  # answered on arrival
            assert another.recv(1000).startswith(b"HTTP/1.1 503")
        assert stalled.recv(100) == b""  # past the timeout the server closed it, and frees its place
        stalled.close()
        time.sleep(0.2)
        assert fetch(url)[0] == 200
    finally:
        server.shutdown()
        server.server_close()



def test_headers_trickled_in_are_cut_at_the_timeout(models):
    """A client that sends its request's head a byte at a time, each byte within the timeout (slowloris), held its
    connection for as long as it went on; each of max_connections such clients closed the page to everyone."""
    server = make_server(TryPage(models), "127.0.0.1", 0, max_connections=1, timeout=1.0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
            connection.sendall(b"GET / HTTP/1.1\r\n")
            started, closed = time.perf_counter(), False
            while not closed and time.perf_counter() - started < 10:
                with contextlib.suppress(OSError):  # a send after the server's close may be reset
                    connection.sendall(b"X-Slow: y\r\n")
                time.sleep(0.3)
                connection.setblocking(False)
                try:
                    closed = connection.recv(100) == b""
                except BlockingIOError:  # nothing yet: still open
                    pass
                except ConnectionResetError:
                    closed = True
                connection.setblocking(True)
            assert closed and time.perf_counter() - started < 3, time.perf_counter() - started
        time.sleep(0.2)
        assert fetch(f"http://127.0.0.1:{port}/")[0] == 200  # its place is free again
    finally:
        server.shutdown()
        server.server_close()

def test_an_upload_that_stops_halfway_is_cut_at_the_timeout(models):
    server = make_server(TryPage(models), "127.0.0.1", 0, timeout=1.0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
            connection.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\nContent-Length: 1000\r\n\r\n--b")
            started = time.perf_counter()
            assert connection.recv(100).startswith(b"HTTP/1.0 408") and time.perf_counter() - started < 10
        assert fetch(f"http://127.0.0.1:{port}/")[0] == 200
    finally:
        server.shutdown()
        server.server_close()


def trickle(models, declared: int) -> tuple[bytes, float]:
    """To a server of a 1 s timeout, POST a head declaring ``declared`` bytes of body, then send it a byte every
    0.2 s until the server answers (at most 15 s): the answer's first bytes and the seconds it took."""
    server = make_server(TryPage(models), "127.0.0.1", 0, timeout=1.0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=30) as connection:
            connection.sendall(f"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\nContent-Length: {declared}\r\n\r\n".encode())
            started = time.perf_counter()
            connection.setblocking(False)
            answer = b""
            while not answer and time.perf_counter() - started < 15:
                with contextlib.suppress(BlockingIOError, InterruptedError, BrokenPipeError, ConnectionResetError):  # a send after the close
                    connection.send(b"x")
                time.sleep(0.2)
                with contextlib.suppress(BlockingIOError):
                    answer = connection.recv(100)
            return answer, time.perf_counter() - started
    finally:
        server.shutdown()
        server.server_close()


def test_an_oversized_body_trickled_in_is_answered_at_the_timeout(models):
    """Over the limit, the body is read away so that the client sees the answer; a client that sends it a byte at a
    time holds the connection no longer than the timeout, not until 64 MB have arrived."""
    answer, seconds = trickle(models, 100_000_000)
    assert answer.startswith(b"HTTP/1.0 413") and seconds < 6, (answer, seconds)

def test_an_ipv6_host_is_served_on_ipv6(models):
    if not socket.has_ipv6:
        pytest.skip("this Python has no IPv6")
    try:
        server = make_server(TryPage(models), "::1", 0)
    except OSError as error:
        pytest.skip(f"this machine has no IPv6 loopback ({error})")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert fetch(f"http://[::1]:{server.server_address[1]}/")[0] == 200
    finally:
        server.shutdown()
        server.server_close()


def test_the_form_is_read_part_by_part():
    body = (
        b"preamble\r\n--b\r\nContent-Disposition: form-data; name=\"photo\"; filename=\"a.png\"\r\n\r\nPNG\r\n-b\r\n"
        b"--b\r\nContent-Disposition: form-data; name=\"sentence\"\r\n\r\nun cercle\r\n--b--\r\n"
    )
    assert form_fields("multipart/form-data; boundary=b", body) == {"photo": (b"PNG\r\n-b", "a.png"), "sentence": (b"un cercle", None)}
    for broken in (b"", b"--b\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\nno end", b"no delimiter at all"):
        with pytest.raises(Exception, match="the form could not be read"):
            form_fields("multipart/form-data; boundary=b", broken)
    with pytest.raises(Exception, match="without a boundary"):
        form_fields("multipart/form-data", body)
    alike = b"".join(b"--b\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nx\r\n" for _ in range(17)) + b"--b--\r\n"
    with pytest.raises(Exception, match="too many parts"):  # parts of one name count each
        form_fields("multipart/form-data; boundary=b", alike)


@pytest.mark.slow
def test_many_large_photos_at_once_stay_within_one_requests_memory(joint, bench):
    """Six 4000 x 4000 PNGs at once: the server's peak stays near one photo's work, far under six side by side.
    One photo's work is about 2.6 decoded photos (the decoded photo, its RGB copy, the figures: 125 MB here);
    what the allocator keeps between requests adds up to as much again (BENCHMARKS.md, "attnkit serve's memory",
    measures it at 7900 x 7900)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("reads the server's memory from /proc")
    serve_memory = bench("serve_memory")
    side, clients = 4000, 6
    one_photo_mb = 2.6 * side * side * 3 / 1e6
    result = serve_memory.measure_server(str(joint), {"pixels": [serve_memory.uniform_png(side)] * clients})
    load = result["loads"]["pixels"]
    assert load["statuses"] == [200] * clients
    assert load["rise_mb"] < 2.4 * one_photo_mb < clients * one_photo_mb  # one request's work at a time, not six


def test_a_url_encoded_form_has_the_multipart_form_s_field_limit():
    """parse_qs splits every field at once: 6 million empty fields in a 20 MB body had cost about 1 GB."""
    assert form_fields("application/x-www-form-urlencoded", b"sentence=un+cercle+rouge&photo=") == {"sentence": (b"un cercle rouge", None), "photo": (b"", None)}
    with pytest.raises(BadRequest, match="more than 16 fields"):
        form_fields("application/x-www-form-urlencoded", b"a=&" * 20)


def test_a_body_trickled_in_is_cut_once_it_falls_behind_the_pace(models):
    """A client that declared 1 MB and sends a byte every 0.2 s kept its place until the declared length's time
    (10 s at 100 kB/s) had passed; the pace is checked at every chunk past the timeout now."""
    answer, seconds = trickle(models, 1_000_000)
    assert answer.startswith(b"HTTP/1.0 408") and seconds < 5, (answer, seconds)


def test_the_request_log_escapes_control_characters(models):
    """A request line is the client's text: its escape sequences reach the log as text, not as the terminal's commands."""
    lines = []
    server = make_server(TryPage(models), "127.0.0.1", 0, log=lines.append)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        raw_exchange("http://127.0.0.1:{}/".format(server.server_address[1]), b"GET /\x1b]0;owned\x07\x1b[2J HTTP/1.0\r\n\r\n")
        time.sleep(0.2)
    finally:
        server.shutdown()
        server.server_close()
    logged = "\n".join(lines)
    assert "owned" in logged and "\x1b" not in logged and "\x07" not in logged and "\\x1b" in logged, logged
