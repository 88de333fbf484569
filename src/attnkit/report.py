"""What a cross-modal comparison writes: the self-contained HTML report, the figure and the statistics.

:func:`write_comparison` writes one image + sentence's figure, report and
statistics JSON; :func:`compare_scenes` scores generated scenes with ground
truth (metrics JSON, distribution plots) and writes the comparison of one.

The report is one file, with no external resources: the image and one attention overlay per target
word are embedded as PNG data URLs. Hovering over or clicking a target word shows
its map over the image next to its weights over the source words, with the
word's statistics; a table lists every word's statistics for both modalities.
For a multi-head decoder (a Transformer) a switch per modality shows, instead of the declared
aggregate, any one layer's head or a layer's mean of heads; those maps are drawn in the browser
from the weights (one embedded PNG per head and word would make the file many megabytes). With
importance maps (``compare(importance=True)``, what :func:`write_comparison` asks for) a view switch
shows, instead of the attention, what each word's log-probability rested on, through attention or
from the input, in both modalities.
"""

from __future__ import annotations

import base64
import html
import io
import sys
from pathlib import Path

from torch import Tensor

from attnkit.analysis import READING, json_number, mostly_inside
from attnkit.importance import ImportanceSettings, importance_distribution
from attnkit.comparison import (
    DEFAULT_EXTRACTION,
    AttentionComparer,
    Comparison,
    comparison_word_groups,
    describe_scene_result,
    evaluate_scenes,
    several_heads,
)
from attnkit.data.scenes import generate_scenes
from attnkit.errors import UserError
from attnkit.files import json_text, write_json_atomic, write_text_atomic
from attnkit.viz import display_image, overlays, plot_cross_modal, plot_distributions, plot_head_tables, plot_importance

SCENE_SPLITS = ("test", "compositional")  # in-distribution held-out scenes, then unseen colour-shape pairs


MAP_PIXELS = 320  # side of each map the report inlines (the page shows them 320 px wide: #image-map)


def _jpeg_data_url(image) -> str:
    """A photo or a map over it, MAP_PIXELS square, inlined: JPEG is a tenth of PNG's size for photographic panels and
    many times faster to encode (a report holds one per word and view: PNG made it 14 MB and its encoding most of its time)."""
    buffer = io.BytesIO()
    image.convert("RGB").resize((MAP_PIXELS, MAP_PIXELS)).save(buffer, format="JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; max-width: 70em; }
h1 { font-size: 1.3em; }
.sentence { margin: 0.3em 0; }
.words { margin: 1em 0; }
.word { font-size: 1.05em; margin: 0.15em; padding: 0.3em 0.6em; border: 1px solid #888; background: #f4f4f4; cursor: pointer; border-radius: 4px; }
.word.active { background: #2a6edb; color: white; border-color: #2a6edb; }
.panels { display: flex; gap: 2em; align-items: flex-end; flex-wrap: wrap; }
.panel h2 { font-size: 1em; margin: 0.3em 0; }
#image-map, #image-canvas { width: 320px; height: 320px; image-rendering: auto; border: 1px solid #ccc; }
.heads { margin: 0.5em 0; }
#source-bars { display: flex; align-items: flex-end; gap: 6px; height: 220px; border-bottom: 1px solid #999; padding: 0 4px; }
.source { display: flex; flex-direction: column; align-items: center; justify-content: flex-end; height: 100%; }
.bar { width: 26px; background: #2a6edb; }
.label { font-size: 0.85em; margin-top: 3px; writing-mode: vertical-rl; transform: rotate(180deg); max-height: 8em; }
table { border-collapse: collapse; margin-top: 1.5em; font-size: 0.9em; }
td, th { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #eee; }
td.text { text-align: left; }
tr.active td { background: #e3ecfb; }
"""

SCRIPT = """
const steps = JSON.parse(document.getElementById("steps").textContent);
const grid = JSON.parse(document.getElementById("grid").textContent);  // [height, width] of the image grid
let shown = 0;
function chosenHead(modality) {  // -1: the declared aggregate, else an index into the step's heads[modality]
  const choice = document.getElementById(modality + "-head");
  return choice ? Number(choice.value) : -1;
}
function summary(weights) {
  const entropy = -weights.reduce((sum, w) => sum + (w > 0 ? w * Math.log(w) : 0), 0);
  return {entropy: entropy, peak: Math.max(...weights)};
}
function jet(x) {  // matplotlib's "jet", as the embedded overlays use
  const channel = c => Math.round(255 * Math.min(1, Math.max(0, 1.5 - Math.abs(4 * x - c))));
  return [channel(3), channel(2), channel(1)];
}
function drawHeadMap(weights) {  // the input image with the head's map upsampled (bilinear) and blended in at 0.5
  const canvas = document.getElementById("image-canvas"), context = canvas.getContext("2d");
  const cells = document.createElement("canvas");
  [cells.height, cells.width] = grid;
  const heat = cells.getContext("2d").createImageData(grid[1], grid[0]), peak = Math.max(...weights, 1e-8);
  weights.forEach((w, i) => { heat.data.set([...jet(w / peak), 255], 4 * i); });
  cells.getContext("2d").putImageData(heat, 0, 0);
  context.globalAlpha = 1;
  context.drawImage(document.getElementById("input-image"), 0, 0, canvas.width, canvas.height);
  context.globalAlpha = 0.5;
  context.imageSmoothingEnabled = true;
  context.drawImage(cells, 0, 0, canvas.width, canvas.height);
}
function shownView() {  // "" for the attention, or an importance form (the view switch, when the report has importance maps)
  const choice = document.getElementById("view");
  return choice ? choice.value : "";
}
function showImportance(t, form) {  // both modalities' importance maps of word t: what its log-probability rested on
  const maps = steps[t].importance[form];
  document.getElementById("image-map").style.display = "";
  document.getElementById("image-canvas").style.display = "none";
  document.getElementById("image-map").src = maps.map;
  document.getElementById("current-word").textContent = steps[t].word + " (" + maps.label + ")";
  maps.weights.forEach((w, s) => {
    document.getElementById("bar-" + s).style.height = (100 * w).toFixed(1) + "%";
    document.getElementById("bar-" + s).title = maps.lost[s] === null ? "" : `log p lost ${maps.lost[s].toFixed(3)}`;
  });
  const said = (m, what) => maps[m].most === null ? `no importance: fewer than two positions` :
    `most important ${what}: ${maps[m].peak}, log p lost there ${maps[m].most.toFixed(3)}` +
    (maps[m].rho === null ? "" : `; rank correlation with attention ${maps[m].rho.toFixed(2)}`);
  document.getElementById("image-stats").textContent = said("image", "cell");
  document.getElementById("text-stats").textContent = said("text", "word");
}
function show(t) {
  shown = t;
  document.querySelectorAll(".word, tr.step").forEach(e => e.classList.toggle("active", Number(e.dataset.step) === t));
  if (shownView()) return showImportance(t, shownView());
  const reading = document.getElementById("reading").checked && steps[t].reading;
  const step = reading ? steps[t].reading : steps[t];
  const imageHead = chosenHead("image"), textHead = chosenHead("text");
  document.getElementById("image-map").style.display = imageHead < 0 ? "" : "none";
  document.getElementById("image-canvas").style.display = imageHead < 0 ? "none" : "";
  const image = imageHead < 0 ? step.image : summary(step.heads.image[imageHead]);
  if (imageHead < 0) document.getElementById("image-map").src = step.map;
  else drawHeadMap(step.heads.image[imageHead]);
  const weights = textHead < 0 ? step.weights : step.heads.text[textHead];
  const text = textHead < 0 ? step.text : summary(weights);
  document.getElementById("current-word").textContent = steps[t].word + (reading ? " (step that has read it)" : "");
  weights.forEach((w, s) => {
    document.getElementById("bar-" + s).style.height = (100 * w).toFixed(1) + "%";
    document.getElementById("bar-" + s).title = w.toFixed(3);
  });
  document.getElementById("image-stats").textContent = `entropy ${image.entropy.toFixed(3)}, peak ${image.peak.toFixed(3)}`;
  document.getElementById("text-stats").textContent = `entropy ${text.entropy.toFixed(3)}, peak ${text.peak.toFixed(3)}`;
}
document.querySelectorAll("input[name=extraction], select.head, select#view").forEach(choice => choice.addEventListener("change", () => show(shown)));
document.querySelectorAll(".word").forEach(button => {
  button.addEventListener("click", () => show(Number(button.dataset.step)));
  button.addEventListener("mouseenter", () => show(Number(button.dataset.step)));
});
show(0);
"""


def head_views(heads: Tensor) -> list[list[float]]:
    """One step's every head (N, h, L) -> what the head switch offers, in :func:`head_labels`' order:
    each layer's heads, then that layer's mean of heads."""
    views = []
    for layer in heads.float():  # (h, L)
        views += [*layer, layer.mean(0)]
    return [[round(float(w), 4) for w in view] for view in views]


def head_labels(layers: int, heads: int) -> list[str]:
    return [label for n in range(layers) for label in [*(f"layer {n + 1}, head {k + 1}" for k in range(heads)), f"layer {n + 1}, mean of heads"]]


def _head_switches(comparison: Comparison) -> dict[str, list[str]]:
    """modality -> the switch's labels, for each modality whose decoder has more than one layer or head
    (none unless the comparison holds both modalities' heads, as ``compare(heads=True)`` gives them)."""
    switches = {}
    if comparison.image_heads is None or comparison.text_heads is None:
        return switches
    for modality, heads in (("image", comparison.image_heads), ("text", comparison.text_heads)):
        if heads.shape[1] * heads.shape[2] > 1:  # (T + 1, N, h, L)
            switches[modality] = head_labels(heads.shape[1], heads.shape[2])
    return switches


def _importance_steps(image, comparison: Comparison, statistics: dict) -> list[dict]:
    """Per step t, form -> what the report's view switch shows of word t in that importance form: the image overlay
    and the source bars of the importance as a distribution, the log-probability lost per source word, and per
    modality the most important position, the loss there and the attention's rank correlation with it."""
    maps = comparison.importance()
    steps: list[dict] = [{} for _ in comparison.target_words]
    drawn: dict[int, list[str]] = {}  # id of an image map -> its overlays: a map two estimators share is drawn once
    for form in comparison.estimators():
        image_map = maps["image"][form]
        if id(image_map) not in drawn:
            drawn[id(image_map)] = [_jpeg_data_url(picture) for picture in overlays(image, importance_distribution(image_map), comparison.grid, longest=MAP_PIXELS)]
        pictures = drawn[id(image_map)]
        text_shares = importance_distribution(maps["text"][form])  # (T, S)
        for t, step in enumerate(steps):
            recorded = statistics["per_word"][t]["importance"]
            view = {"label": comparison.importance_label(form), "map": pictures[t], "weights": [round(float(w), 4) for w in text_shares[t]]}
            view["lost"] = recorded["text"][form]
            for modality in ("image", "text"):
                lost = maps[modality][form][t]  # (L,): NaN everywhere for a source of one position
                peak = int(lost.nan_to_num(float("-inf")).argmax())
                where = comparison.source_words[peak] if modality == "text" else "row {}, column {}".format(*divmod(peak, comparison.grid[1]))
                rho = recorded[modality].get("agreement", {}).get(form, {}).get("rank_correlation")
                view[modality] = {"peak": where, "most": json_number(lost[peak]), "rho": rho}
            step[form] = view
    return steps


def embedded_json(obj) -> str:
    """``obj`` as JSON for a ``<script type="application/json">`` element: every ``<``, ``>`` and ``&`` written as
    ``\\u003c``, ``\\u003e``, ``\\u0026`` (the same string to JSON.parse), so that no text in it can end the element
    (``</script>``) or open a comment (``<!--<script>``) that swallows the report's own scripts."""
    return json_text(obj).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


REPORT_TITLE = "attnkit: attention over an image and over a sentence"


def write_report(path: str | Path, image, comparison: Comparison, statistics: dict, title: str = REPORT_TITLE) -> Path:
    """Write the report for ``comparison`` (``statistics`` as :meth:`Comparison.statistics` gives them).

    With every head's attention in ``comparison`` (``compare(heads=True)``) and a multi-head decoder,
    the report has a head switch per such modality (the module docstring)."""
    return write_text_atomic(path, render_report(image, comparison, statistics, title))


def render_report(image, comparison: Comparison, statistics: dict, title: str = REPORT_TITLE, preamble: str = "") -> str:
    """The report as one self-contained HTML document; ``preamble`` (HTML) goes first in its body (``attnkit serve``'s form)."""
    steps = []
    switches = _head_switches(comparison)
    reading_heads = comparison.head_attention(READING) if switches and comparison.image_reading is not None else None  # (W, N, h, L), (W, N', h', S)
    maps = overlays(image, comparison.image_attention, comparison.grid, longest=MAP_PIXELS)
    reading_maps = overlays(image, comparison.image_reading, comparison.grid, longest=MAP_PIXELS) if comparison.image_reading is not None else []

    def view(picture, weights, statistics_of_step: dict) -> dict:
        return {
            "map": _jpeg_data_url(picture),
            "weights": [round(float(w), 4) for w in weights],
            "image": statistics_of_step["image"],
            "text": statistics_of_step["text"],
        }

    every_head = {"image": comparison.image_heads, "text": comparison.text_heads}  # (T + 1, N, h, L): row t emits word t
    importance_steps = _importance_steps(image, comparison, statistics) if comparison.image_importance is not None else None
    for t, word in enumerate(comparison.target_words):
        per_word = statistics["per_word"][t]
        step = {"word": word, **view(maps[t], comparison.text_attention[t], per_word)}
        if switches:
            step["heads"] = {modality: head_views(every_head[modality][t]) for modality in switches}
        if t < len(reading_maps) and "reading" in per_word:  # words only: no step reads <eos> before it ends
            step["reading"] = view(reading_maps[t], comparison.text_reading[t], per_word["reading"])
            if reading_heads is not None:
                step["reading"]["heads"] = {modality: head_views(reading_heads[m][t]) for m, modality in enumerate(("image", "text")) if modality in switches}
        if importance_steps is not None:
            step["importance"] = importance_steps[t]
        steps.append(step)
    escape = html.escape
    buttons = "".join(f'<button class="word" data-step="{t}">{escape(step["word"])}</button>' for t, step in enumerate(steps))
    bars = "".join(
        f'<div class="source"><div class="bar" id="bar-{s}"></div><div class="label">{escape(word)}</div></div>' for s, word in enumerate(comparison.source_words)
    )
    def erasure_cells(t: int) -> str:
        """log p(word) lost when the peak / a random position is removed from the step's attention, per modality."""
        erased = statistics["per_word"][t].get("erasure")
        if erased is None:
            return ""
        return "".join(f'<td>{erased[m]["peak_drop"]:.2f}</td><td>{erased[m]["random_drop"]:.2f}</td>' for m in ("image", "text"))

    erasure_heads = (
        "<th>image: log p lost, peak erased</th><th>image: random erased</th><th>text: peak erased</th><th>text: random erased</th>"
        if statistics["per_word"] and "erasure" in statistics["per_word"][0]
        else ""
    )
    rows = "".join(
        f'<tr class="step" data-step="{t}"><td class="text">{escape(step["word"])}</td>'
        f'<td>{step["image"]["entropy"]:.3f}</td><td>{step["image"]["peak"]:.3f}</td><td>{step["image"]["effective_positions"]:.2f}</td>'
        f'<td>{step["text"]["entropy"]:.3f}</td><td>{step["text"]["peak"]:.3f}</td><td>{step["text"]["effective_positions"]:.2f}</td>{erasure_cells(t)}</tr>'
        for t, step in enumerate(steps)
    )
    means = "".join(
        f'<tr><td class="text">{modality} (mean over steps)</td><td>{statistics[modality]["entropy"]:.3f}</td><td>{statistics[modality]["peak"]:.3f}</td>'
        f'<td>{statistics[modality]["effective_positions"]:.2f}</td><td>{statistics[modality]["normalised_entropy"]:.3f}</td>'
        f'<td>{statistics[modality]["positions"]}</td></tr>'
        for modality in ("image", "text")
    )
    head_choices = "".join(
        f'<label>{modality} attention: <select class="head" id="{modality}-head"><option value="-1" selected>the declared aggregate</option>'
        + "".join(f'<option value="{k}">{escape(label)}</option>' for k, label in enumerate(labels))
        + "</select></label> "
        for modality, labels in switches.items()
    )
    if importance_steps is not None:  # the view switch: attention, or what the output rested on
        head_choices += (
            '<label>show: <select id="view"><option value="" selected>attention</option>'
            + "".join(f'<option value="{form}">{escape(comparison.importance_label(form))}</option>' for form in comparison.estimators())
            + "</select></label>"
        )
    head_choices = f'<p class="heads">{head_choices}</p>' if head_choices else ""
    height, width = comparison.grid
    target = " ".join(w for w in comparison.target_words[:-1])
    document = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title><style>{STYLE}</style></head>
<body>
{preamble}<h1>{escape(title)}</h1>
<p class="sentence"><b>target</b> (forced through both encoders): {escape(target)}</p>
<p class="sentence"><b>source</b>: {escape(" ".join(comparison.source_words))}</p>
<p>Hover over or click a target word to see where the decoder looked, over the {height}&times;{width} image grid and over the source words.</p>
<div class="words">{buttons}</div>
<p>A word's attention from <label><input type="radio" name="extraction" id="emitting" value="emitting" checked> the step that emits it</label>
<label><input type="radio" name="extraction" id="reading" value="reading"> the step whose query has read it (Shift-Att; words only)</label></p>
{head_choices}
<div class="panels">
  <div class="panel"><h2>image: <span id="current-word"></span></h2><img id="image-map" alt="attention over the image">
    <canvas id="image-canvas" width="320" height="320" style="display: none"></canvas><div id="image-stats"></div></div>
  <div class="panel"><h2>source words</h2><div id="source-bars">{bars}</div><div id="text-stats"></div></div>
  <div class="panel"><h2>input</h2><img id="input-image" src="{_jpeg_data_url(display_image(image))}" width="160" height="160" alt="input image"></div>
</div>
<table><tr><th>target word</th><th>image entropy</th><th>image peak</th><th>image eff. cells</th><th>text entropy</th><th>text peak</th><th>text eff. words</th>{erasure_heads}</tr>{rows}</table>
<table><tr><th>modality</th><th>entropy (nats)</th><th>peak</th><th>effective positions</th><th>entropy / log L</th><th>positions L</th></tr>{means}</table>
<script type="application/json" id="steps">{embedded_json(steps)}</script>
<script type="application/json" id="grid">{embedded_json([height, width])}</script>
<script>{SCRIPT}</script>
</body></html>
"""
    return document


def write_comparison(
    comparer: AttentionComparer, image, source: str, target: str | None, out: Path, title: str = "", log=print,
    importance: bool | ImportanceSettings = True,
) -> list[tuple[Path, str]]:
    """The PNGs, HTML report and statistics JSON of one image + sentence, importance maps beside the attention
    (``importance``: True for the default estimators, or the settings of :mod:`attnkit.importance`; without them no
    importance.png is written and the report has no view switch)."""
    comparison = comparer.compare([image], [source], None if target is None else [target], heads=True, importance=importance)[0]  # the report's switches
    extra = {"target_given": target is not None, "unknown_words": _unknown_target_words(comparer, comparison)}
    return _write_comparison_files(image, comparison, extra, out, title, log, {})


def _unknown_target_words(comparer: AttentionComparer, comparison: Comparison) -> dict[str, list[str]]:
    """Per model, the target words its vocabulary lacks, with a warning for each model that lacks any: such a word is
    forced as <unk>, so its maps are that token's (the figures label it with the word). A decoded caption too may hold
    words a separate translator never saw."""
    unknown = comparer.unknown_words(comparison.target_words[:-1])
    for model, words in unknown.items():
        if words:
            print(f"warning: the {model} does not know {len(words)} target word(s) ({' '.join(words)}); each is forced as <unk>", file=sys.stderr)
    return unknown


def write_mosaic_comparison(
    comparer: AttentionComparer, images: list, sources: list[str], target: str | None, own: int, out: Path, title: str = "", log=print
) -> list[tuple[Path, str]]:
    """The same files for a target forced over a 2 x 2 mosaic and four joined source sentences (input ``own`` is the one
    the target describes; default target: the caption decoded from its photo alone); ``statistics.json`` adds each
    word's localisation: its attention mass on its own input and whether its peak lies there."""
    found = comparer.compare_mosaic(images, sources, target, own, heads=True)
    groups = comparison_word_groups(comparer, found.comparison)
    by_word = found.localisation()
    words = found.comparison.target_words[:-1]
    image_region, text_region = found.regions()
    localised = {
        "own": own,
        "source_lengths": list(found.source_lengths),
        "chance": {"image": round(float(image_region.mean()), 4), "text": round(float(text_region.mean()), 4)},
        "pointing_chance": {modality: round(float(mostly_inside(region).double().mean()), 4) for modality, region in zip(("image", "text"), (image_region, text_region))},
        "per_word": [
            {"word": word, "group": groups[t], **{modality: {"mass": round(float(mass[t]), 4), "peak_inside": bool(hits[t])} for modality, (mass, hits) in by_word.items()}}
            for t, word in enumerate(words)
        ],
        "mean": {modality: {"mass": round(float(mass.mean()), 4), "pointing": round(float(hits.float().mean()), 4)} for modality, (mass, hits) in by_word.items()},
    }
    log("localisation (attention on the own input; pointing game): " + ", ".join(f"{m} {100 * v['mass']:.1f}% / {100 * v['pointing']:.1f}%" for m, v in localised["mean"].items()))
    plot = {"source_lengths": found.source_lengths, "own": own}  # the figure draws the sentence borders and the quadrants
    extra = {"target_given": target is not None, "unknown_words": _unknown_target_words(comparer, found.comparison), "localisation": localised}
    return _write_comparison_files(found.image, found.comparison, extra, out, title, log, plot)


def _write_comparison_files(image, comparison: Comparison, extra: dict, out: Path, title: str, log, plot: dict) -> list[tuple[Path, str]]:
    statistics = comparison.statistics()
    sentence = " ".join(comparison.target_words[:-1])
    out.mkdir(parents=True, exist_ok=True)
    png = plot_cross_modal(image, comparison, out / "comparison.png", title=title or sentence, **plot)
    written = [(png, "each target word's attention over the image (panels) and over the source words (matrix)")]
    if comparison.image_importance is not None:
        written.append((plot_importance(image, comparison, out / "importance.png", title=title or sentence), "each word's attention beside its importance maps, both modalities"))
    else:  # an earlier comparison's figure would pass for this one's
        (out / "importance.png").unlink(missing_ok=True)
    html = write_report(out / "report.html", image, comparison, statistics)
    record = {"target": sentence, **extra, "source_words": comparison.source_words, "grid": list(comparison.grid), **statistics}
    stats = write_json_atomic(out / "statistics.json", record)
    log(f"target: {sentence}\nimage attention: {statistics['image']}\ntext attention:  {statistics['text']}")
    if "agreement" in statistics:
        log("attention against importance, rank correlation (shuffled attention): " + ", ".join(
            f"{modality} {form} {found['rank_correlation']} ({found['shuffled_rank_correlation']})"
            for modality, by_form in statistics["agreement"].items() for form, found in by_form.items()
        ))  # fmt: skip
    return [*written, (html, "interactive report"), (stats, "statistics")]


def compare_scenes(
    comparer: AttentionComparer,
    out: Path,
    count: int,
    seed: int = 0,
    size: int = 128,
    beam: int | None = None,
    log=print,
    extraction: str = DEFAULT_EXTRACTION,
    importance: bool | ImportanceSettings = True,
    progress: bool | None = None,
) -> list[tuple[Path, str]]:
    """Metrics JSON and distribution plots on ``count`` generated scenes per split, and the comparison of one scene.

    ``extraction``: which step's attention is a word's in the headline grounding and the plots; the
    metrics hold the grounding under every extraction too. ``importance``: the metrics score the importance maps
    too (:func:`~attnkit.comparison.evaluate_scenes`; True: the default estimators, or those the settings name;
    docs/comparison.md gives the cost); the one scene's comparison always draws them. ``progress``: a progress bar over each split's scenes (None: where standard error is a terminal)."""
    if comparer.translator.pipeline.source_lang != "fr" or comparer.translator.pipeline.target_lang != "en":
        raise UserError("generated scenes are described in French and English: this needs a French -> English model trained on scenes")
    if count < 1:
        raise UserError("the number of scenes must be at least 1")
    metrics: dict = {"seed": seed, "scene_size": size}
    distributions = {}
    for split in SCENE_SPLITS:
        scenes = generate_scenes(count, seed, split, size)
        result = evaluate_scenes(comparer, scenes, beam_size=beam, extraction=extraction, importance=importance, progress=progress)
        distributions[split] = result.pop("distributions")
        metrics[split] = result
        first, *erasure = describe_scene_result(result)
        log("\n".join([f"{split}: {first}", *erasure]))
    out.mkdir(parents=True, exist_ok=True)
    metrics_json = write_json_atomic(out / "metrics.json", metrics)
    series = {
        f"{statistic.replace('_', ' ')}": {f"{modality} ({split})": distributions[split][f"{modality}_{statistic}"] for split in SCENE_SPLITS for modality in ("image", "text")}
        for statistic in ("normalised_entropy", "peak")
    }
    plot = plot_distributions(series, out / "distributions.png", title=f"attention per target word, {count} scenes per split")
    drops = {
        f"{modality}: log p(word) lost": {
            f"{removed} removed ({split})": distributions[split][f"{modality}_{removed}_drop"] for split in SCENE_SPLITS[:1] for removed in ("peak", "random")
        }
        for modality in ("image", "text")
    }
    highest = max((max(values, default=0.0) for panel in drops.values() for values in panel.values()), default=1.0)
    erasure_plot = plot_distributions(
        drops, out / "erasure.png", title=f"erasure: the attention peak against a random position, {count} test scenes", value_range=(-0.5, max(1.0, highest))
    )
    outputs = [
        (metrics_json, "quality, grounding, erasure and attention statistics per split"),
        (plot, "entropy and peak weight per modality"),
        (erasure_plot, "what removing the attention peak, or a random position, costs each word: both modalities"),
    ]
    heads = metrics[SCENE_SPLITS[0]]["grounding_by_head"]
    if several_heads(heads):
        with_means = {
            name: [[*row, mean] for row, mean in zip(heads[name], heads[f"{name}_layer_mean"])] for name in ("image_pointing_hit_rate", "text_aer")
        }  # each layer's mean of heads as a last column
        head_plot = plot_head_tables(
            {"image: pointing hit rate (%)": (with_means["image_pointing_hit_rate"], "Greens"), "text: AER": (with_means["text_aer"], "Reds_r")},
            out / "heads.png",
            title=f"every layer's and head's attention, {count} {SCENE_SPLITS[0]} scenes ({extraction} step)",
            columns=[*(str(h + 1) for h in range(len(heads["text_aer"][0]))), "mean"],
        )
        outputs.append((head_plot, "the pointing game and the AER of every layer's every head"))
    example = generate_scenes(1, seed, "test", size)[0]
    sentence = example.sentences[0]
    drawn = importance if isinstance(importance, ImportanceSettings) else True
    outputs += write_comparison(comparer, example.image(), sentence.french_text, sentence.english_text, out / "example", log=log, importance=drawn)
    return outputs
