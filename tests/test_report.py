"""The HTML report in a real browser: headless Chromium driven through chromedriver (Selenium).

Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them) and the
``selenium`` package (a dev dependency). Without them the test is skipped, and the
skip message says what is missing.
"""

import shutil

import pytest
import torch
from PIL import Image

from attnkit.comparison import Comparison
from attnkit.report import write_report


def _browser():
    chromium, driver = shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip("browser test skipped: Chromium and chromedriver are not installed (apt-get install chromium chromium-driver; .ci/run does)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="browser test skipped: the selenium package is missing (pip install -e '.[dev]')")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"):
        options.add_argument(flag)
    return webdriver.Chrome(service=webdriver.ChromeService(executable_path=driver), options=options)


def _comparison() -> Comparison:
    image_attention = torch.eye(4)[[0, 3, 1, 2]]  # each word looks at another cell
    text_attention = torch.tensor([[0.7, 0.1, 0.2], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6], [0.3, 0.3, 0.4]])
    reading_image, reading_text = image_attention[[1, 2, 3]], text_attention[[1, 2, 3]]  # the next step's, as a luong decoder reads
    return Comparison(["a", "red", "circle", "<eos>"], image_attention, (2, 2), ["un", "cercle", "rouge"], text_attention, reading_image, reading_text)


def test_report_renders_and_choosing_a_word_changes_the_maps(tmp_path):
    browser = _browser()  # skips, saying why, before selenium is imported
    from selenium.webdriver import ActionChains
    from selenium.webdriver.common.by import By

    comparison = _comparison()
    path = write_report(tmp_path / "report.html", Image.new("RGB", (64, 64), (90, 120, 90)), comparison, comparison.statistics())
    try:
        browser.get(path.resolve().as_uri())
        words = browser.find_elements(By.CSS_SELECTOR, "button.word")
        assert [w.text for w in words] == comparison.target_words
        shown = browser.find_element(By.ID, "image-map")
        assert shown.get_attribute("src").startswith("data:image/png;base64,")
        assert browser.execute_script("return document.getElementById('image-map').naturalWidth") > 0  # the PNG decodes

        def state():
            heights = [browser.find_element(By.ID, f"bar-{s}").value_of_css_property("height") for s in range(3)]
            return shown.get_attribute("src"), browser.find_element(By.ID, "current-word").text, heights

        first = state()
        assert first[1] == "a"
        words[2].click()
        clicked = state()
        assert clicked[1] == "circle" and clicked[0] != first[0] and clicked[2] != first[2]
        assert "active" in words[2].get_attribute("class") and "active" not in words[0].get_attribute("class")
        ActionChains(browser).move_to_element(words[1]).perform()  # hovering shows a word too
        assert state()[1] == "red" and state()[0] not in (first[0], clicked[0])
        emitting_red = state()
        browser.find_element(By.ID, "reading").click()  # the same word at the step whose query has read it
        assert state()[1].startswith("red") and state()[0] != emitting_red[0] and state()[2] != emitting_red[2]
        assert state()[0] == clicked[0]  # "red" is read by the step that emits "circle"
    finally:
        browser.quit()
