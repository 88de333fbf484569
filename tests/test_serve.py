"""attnkit serve: the page answers a good photo, a good sentence, both (the comparison report), each bad upload with
its message (and stays up), two requests at once, never a file on the server; in headless Chromium a dropped photo
and a typed sentence give the report, whose words switch the maps."""

import io
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from attnkit.commands import serve as serve_command
from attnkit.config import load_config
from attnkit.data.scenes import generate_scenes, write_scene_dataset
from attnkit.errors import run_cli
from attnkit.multitask import train_multitask
from attnkit.serve import Models, TryPage, make_server

BOUNDARY = "attnkit-test-boundary"


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


@pytest.mark.parametrize(
    ("upload", "options", "status", "message"),
    [
        (dict(photo=b"this is not a picture"), {}, 400, "not an image file"),
        (dict(photo=b""), {}, 400, "drop a photo or type a sentence"),
        (dict(photo=b"x" * 60_000), dict(max_upload_bytes=50_000), 413, "over the limit of 0.05 MB"),
        (dict(photo="scene"), dict(max_pixels=1000), 400, "64x64 pixels is over the limit of 1,000"),
        (dict(sentence="   "), {}, 400, "drop a photo or type a sentence"),
        (dict(sentence="zzz qqq xxyy"), {}, 400, "the sentence:"),
    ],
    ids=["not-an-image", "empty-photo", "too-large", "too-many-pixels", "empty-text", "unknown-words"],
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
    with pytest.raises(SystemExit):
        serve_command.get_args_parser().parse_args(["--checkpoint", "x", "--port", "70000"])


def test_in_a_browser_a_photo_and_a_sentence_give_the_report(serving, tmp_path):
    from test_report import _browser

    browser = _browser()  # skips, saying why, when Chromium is missing
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    url = serving()
    photo, french = scene_png()
    (tmp_path / "scene.png").write_bytes(photo)
    (tmp_path / "notes.txt").write_text("not a photo")
    try:
        browser.get(url)
        browser.find_element(By.ID, "photo").send_keys(str(tmp_path / "scene.png"))
        browser.find_element(By.ID, "sentence").send_keys(french)
        browser.find_element(By.ID, "go").click()
        WebDriverWait(browser, 120).until(lambda b: b.find_elements(By.CSS_SELECTOR, "button.word"))
        assert browser.find_element(By.ID, "caption").text and browser.find_element(By.ID, "translation").text
        words = browser.find_elements(By.CSS_SELECTOR, "button.word")
        shown = browser.find_element(By.ID, "image-map")
        first = shown.get_attribute("src")
        words[-1].click()
        assert browser.find_element(By.ID, "current-word").text == words[-1].text and (len(words) == 1 or shown.get_attribute("src") != first)

        browser.find_element(By.ID, "photo").send_keys(str(tmp_path / "notes.txt"))  # a bad upload: the message on the page
        browser.find_element(By.ID, "go").click()
        WebDriverWait(browser, 60).until(lambda b: b.find_elements(By.ID, "error"))
        assert "not an image file" in browser.find_element(By.ID, "error").text
    finally:
        browser.quit()
