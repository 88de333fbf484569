"""The HTML report in a real browser: headless Chromium driven through chromedriver (Selenium).

Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them) and the
``selenium`` package (a dev dependency). Without them the test is skipped, and the
skip message says what is missing.
"""

import json
import re
import shutil
from dataclasses import replace

import pytest
import torch
from PIL import Image

from attnkit.comparison import Comparison
from attnkit.report import head_labels, write_report


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


def _multi_head_comparison() -> Comparison:
    """_comparison() as a 2-layer, 2-head decoder would give it: every head's weights for every step, <eos> read too."""
    generator = torch.Generator().manual_seed(0)
    image_heads = torch.softmax(torch.randn(5, 2, 2, 4, generator=generator), -1)  # (T + 1, N, h, L)
    text_heads = torch.softmax(torch.randn(5, 2, 2, 3, generator=generator), -1)  # (T + 1, N, h, S)
    return replace(_comparison(), image_heads=image_heads, text_heads=text_heads)


def _report_steps(path) -> list[dict]:
    return json.loads(re.search(r'<script type="application/json" id="steps">(.*?)</script>', path.read_text(), re.S).group(1))


def test_a_multi_head_report_offers_every_head_and_each_layers_mean_of_both_steps(tmp_path):
    comparison = _multi_head_comparison()
    path = write_report(tmp_path / "report.html", Image.new("RGB", (64, 64)), comparison, comparison.statistics())
    assert head_labels(2, 2) == ["layer 1, head 1", "layer 1, head 2", "layer 1, mean of heads", "layer 2, head 1", "layer 2, head 2", "layer 2, mean of heads"]
    document = path.read_text()
    assert 'id="image-head"' in document and 'id="text-head"' in document and "layer 2, mean of heads" in document
    steps = _report_steps(path)
    for t, step in enumerate(steps):
        for modality, heads in (("image", comparison.image_heads), ("text", comparison.text_heads)):
            views = torch.tensor(step["heads"][modality])  # (6, L)
            emitted = torch.cat([heads[t, 0], heads[t, 0].mean(0, keepdim=True), heads[t, 1], heads[t, 1].mean(0, keepdim=True)])
            assert torch.allclose(views, emitted, atol=1e-4) and torch.allclose(views.sum(-1), torch.ones(6), atol=1e-3)
            if t < len(steps) - 1:  # a word's reading step is the next one (offset 1): what has read it
                assert torch.allclose(torch.tensor(step["reading"]["heads"][modality])[3], heads[t + 1, 1, 0], atol=1e-4)
    assert "reading" not in steps[-1]  # no step reads <eos> before the sentence ends


def test_a_single_head_report_has_no_head_switch(tmp_path):
    comparison = _comparison()
    one_head = replace(comparison, image_heads=torch.rand(5, 1, 1, 4).softmax(-1), text_heads=torch.rand(5, 1, 1, 3).softmax(-1))
    path = write_report(tmp_path / "report.html", Image.new("RGB", (64, 64)), one_head, one_head.statistics())
    assert 'class="head"' not in path.read_text() and "heads" not in _report_steps(path)[0]


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
        assert shown.get_attribute("src").startswith("data:image/jpeg;base64,")
        assert browser.execute_script("return document.getElementById('image-map').naturalWidth") > 0  # the JPEG decodes

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


def test_the_head_switch_draws_the_chosen_heads_map_and_bars(tmp_path):
    browser = _browser()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    comparison = _multi_head_comparison()
    path = write_report(tmp_path / "report.html", Image.new("RGB", (64, 64), (90, 120, 90)), comparison, comparison.statistics())
    try:
        browser.get(path.resolve().as_uri())

        def bars():
            return [float(browser.find_element(By.ID, f"bar-{s}").get_attribute("title")) for s in range(3)]

        def shown(element):
            return browser.find_element(By.ID, element).is_displayed()

        browser.find_elements(By.CSS_SELECTOR, "button.word")[1].click()
        assert shown("image-map") and not shown("image-canvas")
        assert bars() == pytest.approx(comparison.text_attention[1].tolist(), abs=1e-3)  # the declared aggregate
        Select(browser.find_element(By.ID, "text-head")).select_by_visible_text("layer 2, head 1")
        assert bars() == pytest.approx(comparison.text_heads[1, 1, 0].tolist(), abs=1e-3)
        Select(browser.find_element(By.ID, "image-head")).select_by_visible_text("layer 1, mean of heads")
        assert shown("image-canvas") and not shown("image-map")
        drawn = browser.execute_script(
            "const c = document.getElementById('image-canvas'); const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
            "const at = (x, y) => Array.from(d.slice(4 * (y * c.width + x), 4 * (y * c.width + x) + 3));"
            "return [at(10, 10), at(c.width - 10, 10)];"
        )  # the colour in the top-left and the top-right cell: jet colours of different weights over one grey
        assert drawn[0] != drawn[1]
        expected = comparison.image_heads[1, 0].mean(0)
        entropy = float(-(expected * expected.log()).sum())
        shown_entropy = float(browser.find_element(By.ID, "image-stats").text.split(",")[0].removeprefix("entropy "))
        assert shown_entropy == pytest.approx(entropy, abs=2e-3)  # from the weights as embedded (4 decimals)
        browser.find_element(By.ID, "reading").click()  # the switch holds for the reading step too
        assert bars() == pytest.approx(comparison.text_heads[2, 1, 0].tolist(), abs=1e-3)
    finally:
        browser.quit()


def _comparison_with_importance() -> Comparison:
    """_comparison() with importance maps: through attention, word t rests on cell t and source word t % 3; from the
    input, on cell 3 - t and source word 2 - t % 3 (log p lost 2.0 there, 0.5 at one other position, else 0)."""
    maps = {"image": {}, "text": {}}
    for form, cell, word in (("attention", lambda t: t, lambda t: t % 3), ("input", lambda t: 3 - t, lambda t: 2 - t % 3)):
        image, text = torch.zeros(4, 4), torch.zeros(4, 3)
        for t in range(4):
            image[t, cell(t)], image[t, (cell(t) + 1) % 4] = 2.0, 0.5
            text[t, word(t)], text[t, (word(t) + 1) % 3] = 2.0, 0.5
        maps["image"][form], maps["text"][form] = image, text
    return replace(_comparison(), image_importance=maps["image"], text_importance=maps["text"])


def test_the_view_switch_shows_each_importance_form_of_both_modalities(tmp_path):
    comparison = _comparison_with_importance()
    statistics = comparison.statistics()
    assert statistics["per_word"][1]["importance"]["text"]["input"] == [0.0, 2.0, 0.5]
    assert set(statistics["agreement"]["image"]) == {"attention", "input"}
    path = write_report(tmp_path / "report.html", Image.new("RGB", (64, 64), (90, 120, 90)), comparison, statistics)
    assert 'id="view"' in path.read_text()
    browser = _browser()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    try:
        browser.get(path.resolve().as_uri())
        browser.find_elements(By.CSS_SELECTOR, "button.word")[1].click()

        def heights():
            return [float(browser.find_element(By.ID, f"bar-{s}").get_attribute("style").split("height:")[1].split("%")[0]) for s in range(3)]

        attention_map = browser.find_element(By.ID, "image-map").get_attribute("src")
        assert heights() == pytest.approx([10.0, 80.0, 10.0], abs=0.1)  # the attention of "red"
        Select(browser.find_element(By.ID, "view")).select_by_visible_text("importance, one position hidden")
        assert heights() == pytest.approx([0.0, 80.0, 20.0], abs=0.1)  # 2.0 and 0.5 of 2.5
        assert browser.find_element(By.ID, "current-word").text == "red (importance, one position hidden)"
        assert browser.find_element(By.ID, "image-map").get_attribute("src") != attention_map
        assert "most important cell: row 1, column 0," in browser.find_element(By.ID, "image-stats").text  # input form: cell 3 - 1 = 2
        assert "most important word: cercle," in browser.find_element(By.ID, "text-stats").text
        browser.find_elements(By.CSS_SELECTOR, "button.word")[0].click()  # the switch stays on the chosen view
        assert heights() == pytest.approx([20.0, 0.0, 80.0], abs=0.1)  # word 0 rests on source word 2, then 0
        Select(browser.find_element(By.ID, "view")).select_by_visible_text("importance through attention")
        assert heights() == pytest.approx([80.0, 20.0, 0.0], abs=0.1)  # through attention word 0 rests on source word 0, then 1
        assert browser.find_element(By.ID, "current-word").text == "a (importance through attention)"
        Select(browser.find_element(By.ID, "view")).select_by_visible_text("attention")
        assert heights() == pytest.approx([70.0, 10.0, 20.0], abs=0.1)
    finally:
        browser.quit()


def test_a_report_with_a_one_word_source_has_no_importance_there_and_still_works(tmp_path):
    comparison = _comparison_with_importance()
    one_word = replace(
        comparison, source_words=["cercle"], text_attention=torch.ones(4, 1), text_reading=torch.ones(3, 1),
        text_importance={form: torch.full((4, 1), float("nan")) for form in ("attention", "input")},
    )  # fmt: skip
    statistics = one_word.statistics()
    assert statistics["per_word"][0]["importance"]["text"]["input"] == [None]
    path = write_report(tmp_path / "report.html", Image.new("RGB", (64, 64), (90, 120, 90)), one_word, statistics)
    steps = re.search(r'<script type="application/json" id="steps">(.*?)</script>', path.read_text(), re.S).group(1)
    json.loads(steps, parse_constant=lambda constant: pytest.fail(f"{constant} in the report's data: JSON.parse would throw"))


HOSTILE = "<!--<script>"  # opens an HTML comment, then a script: unescaped, it swallows every script after it


def _comparison_with_a_hostile_word() -> Comparison:
    """_comparison_with_importance() over the source "un <!--<script> cercle", with a target word of <, > and & too:
    the importance of "red" peaks on the hostile word, so the report's data carries it."""
    return replace(_comparison_with_importance(), source_words=["un", HOSTILE, "cercle"], target_words=["a", "red", "<b>&amp;", "<eos>"])


def test_the_reports_data_holds_no_angle_bracket_or_ampersand_and_reads_back_the_same(tmp_path):
    comparison = _comparison_with_a_hostile_word()
    path = write_report(tmp_path / "report.html", Image.new("RGB", (64, 64)), comparison, comparison.statistics())
    for data in re.findall(r'<script type="application/json" id="\w+">(.*?)</script>', path.read_text(), re.S):
        assert not set("<>&") & set(data)  # each written as \u003c, \u003e, \u0026
    steps = _report_steps(path)
    assert steps[1]["importance"]["input"]["text"]["peak"] == HOSTILE and steps[2]["word"] == "<b>&amp;"


def test_a_source_word_that_opens_a_comment_and_a_script_leaves_the_reports_buttons_working(tmp_path):
    comparison = _comparison_with_a_hostile_word()
    path = write_report(tmp_path / "report.html", Image.new("RGB", (64, 64), (90, 120, 90)), comparison, comparison.statistics())
    browser = _browser()
    from selenium.webdriver.common.by import By

    try:
        browser.get(path.resolve().as_uri())
        assert browser.find_element(By.ID, "current-word").text == "a"  # the scripts ran: they show the first word
        words = browser.find_elements(By.CSS_SELECTOR, "button.word")
        assert [w.text for w in words] == comparison.target_words
        words[2].click()
        assert browser.find_element(By.ID, "current-word").text == "<b>&amp;"
        heights = [float(browser.find_element(By.ID, f"bar-{s}").get_attribute("style").split("height:")[1].split("%")[0]) for s in range(3)]
        assert heights == pytest.approx([20.0, 20.0, 60.0], abs=0.1)  # the third word's attention over the source
        assert [label.text for label in browser.find_elements(By.CSS_SELECTOR, "#source-bars .label")] == ["un", HOSTILE, "cercle"]
    finally:
        browser.quit()
