"""Small PNG charts for the Dagster UI, one per question a data engineer asks of a materialization.

Pure matplotlib, no Dagster: each function takes plain figures (lists, dicts, floats) and returns
PNG bytes, 640x320 pixels at 100 dpi, that `markdown_image` embeds as a data URI (Dagster's UI
renders base64 images in markdown metadata). Drawing goes through `matplotlib.figure.Figure` and
the Agg canvas, never pyplot: pyplot keeps every figure in a process-wide registry (a leak in a
long-lived run worker unless each is closed) and picks an interactive backend where a display
exists; a bare Figure on Agg has neither problem and is freed with its last reference.

The bytes are deterministic (no "Software" PNG text chunk, a fixed size, no timestamps), so the
same figures give the same picture, and the renders are cached by a digest of their inputs: a
re-materialization with unchanged figures does not draw again. Edge inputs never raise: an empty
series draws "no data" in its panel, NaN points are gaps, one point is drawn as a marker; a
negative or non-finite duration is a gap too, an unbounded band is not drawn, and an axis stops at
_MAX_AXIS.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import math
from collections import OrderedDict
from typing import Callable, Mapping, Sequence

WIDTH_IN, HEIGHT_IN, DPI = 6.4, 3.2, 100  # 640x320 pixels: readable in the metadata panel, ~20-40 kB
PASS, FAIL, NEUTRAL, MUTED = "#2a7f3f", "#c0392b", "#2c6fbb", "#8c8c8c"
_CACHE_SIZE = 128  # a run draws a few dozen charts; bytes are tens of kB each
_cache: OrderedDict[str, bytes] = OrderedDict()


def markdown_image(title: str, png: bytes) -> str:
    """`png` as a markdown image with a base64 data URI, for `dg.MetadataValue.md`."""
    alt = title.replace("[", "(").replace("]", ")")
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode('ascii')})"


def _render(kind: str, payload: dict) -> bytes:
    key = hashlib.sha256(json.dumps([kind, payload], sort_keys=True, default=str).encode()).hexdigest()
    if key in _cache:
        _cache.move_to_end(key)
        return _cache[key]
    png = _draw(_DRAWERS[kind], payload)
    _cache[key] = png
    if len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)
    return png


def _draw(drawer: Callable, payload: dict) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # imported here: the code location loads without it
    from matplotlib.figure import Figure

    figure = Figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI, layout="tight")
    FigureCanvasAgg(figure)
    try:
        drawer(figure, payload)
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None}, pil_kwargs={"optimize": True})
        return buffer.getvalue()
    finally:
        figure.clear()


def _finite(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def _clean(values: Sequence[float | None]) -> list[float]:
    """None and infinities as NaN: matplotlib leaves a gap there."""
    return [float(v) if v is not None and math.isfinite(v) else math.nan for v in values]


def _no_data(axes, title: str) -> None:
    axes.set_title(title, fontsize=9)
    axes.text(0.5, 0.5, "no data", ha="center", va="center", color=MUTED, transform=axes.transAxes)
    axes.set_xticks([])
    axes.set_yticks([])


def _line(axes, xs: Sequence[float], ys: Sequence[float | None], **style) -> None:
    ys = _clean(ys)
    one = len(_finite(ys)) == 1  # a lone point has no segment to draw
    axes.plot(xs, ys, marker="o" if one else None, markersize=4, linewidth=1.2, **style)


def _style(axes, title: str, xlabel: str = "", ylabel: str = "") -> None:
    axes.set_title(title, fontsize=9)
    axes.set_xlabel(xlabel, fontsize=8)
    axes.set_ylabel(ylabel, fontsize=8)
    axes.tick_params(labelsize=7)
    axes.grid(alpha=0.3, linewidth=0.5)


# Stage loss and eval gate --------------------------------------------------------------------


def stage_loss_chart(stage: str, steps: Sequence[int], losses: Sequence[float], gate: Sequence[Mapping]) -> bytes:
    """Training loss by step with the held-out loss at the last step against the gate's threshold,
    its reference (the previous stage or the untrained model) and one seed-noise band around that
    reference (left); every gated metric's margin over its threshold in noise bands (right).
    `gate`: per metric {metric, value, reference, compared_with, threshold, band, margin_bands, passed}."""
    payload = {"stage": stage, "steps": [int(s) for s in steps], "losses": _clean(losses),
               "gate": [dict(g) for g in gate]}
    return _render("stage_loss", payload)


def _draw_stage_loss(figure, p: dict) -> None:
    left, right = figure.subplots(1, 2, gridspec_kw={"width_ratios": [2.2, 1]})
    heldout = next((g for g in p["gate"] if g["metric"] == "heldout_loss"), None)
    if not p["steps"] and heldout is None:
        _no_data(left, f"{p['stage']}: loss")
    else:
        if p["steps"]:
            _line(left, p["steps"], p["losses"], color=NEUTRAL, label="training loss")
        if heldout is not None:
            _gate_marks(left, heldout, at=p["steps"][-1] if p["steps"] else 0)
        _style(left, f"{p['stage']}: loss (nats/token)", "step")
        left.legend(fontsize=6, loc="upper right")
    _draw_margins(right, p["gate"])


def _gate_marks(axes, g: Mapping, at: int) -> None:
    reference, band = g.get("reference"), g.get("band")
    if reference is not None and band:
        axes.axhspan(reference - band, reference + band, color=MUTED, alpha=0.2,
                     label=f"{g.get('compared_with', 'reference')} ±1 noise band")
    if g.get("threshold") is not None:
        axes.axhline(g["threshold"], color=FAIL, linestyle="--", linewidth=1, label="gate threshold")
    axes.plot([at], _clean([g.get("value")]), marker="D", markersize=6, linestyle="none",
              color=PASS if g.get("passed") else FAIL, label="held-out loss")


def _draw_margins(axes, gate: Sequence[Mapping]) -> None:
    margins = [(g["metric"], g.get("margin_bands"), g.get("passed")) for g in gate]
    if not margins:
        _no_data(axes, "gate margin")
        return
    names = [m[0] for m in margins]
    values = [v if v is not None and math.isfinite(v) else 0.0 for _, v, _ in margins]
    axes.barh(names, values, color=[PASS if ok else FAIL for *_, ok in margins])
    axes.axvline(0, color="black", linewidth=0.8)
    _style(axes, "gate margin (noise bands)", "beyond threshold")


# Post-training curves ------------------------------------------------------------------------


def curves_chart(title: str, curves: Mapping[str, Sequence[float]]) -> bytes:
    """One small panel per curve (reward, loss, KL, ...) by optimizer step, in the given order."""
    payload = {"title": title, "curves": {name: _clean(v) for name, v in curves.items()}}
    return _render("curves", payload)


def _draw_curves(figure, p: dict) -> None:
    curves = p["curves"] or {"curve": []}
    panels = figure.subplots(1, len(curves), squeeze=False)[0]
    for axes, (name, values) in zip(panels, curves.items()):
        if not _finite(values):
            _no_data(axes, name)
            continue
        _line(axes, list(range(len(values))), values, color=NEUTRAL)
        _style(axes, name, "step")
    figure.suptitle(p["title"], fontsize=9)


# Goodput ----------------------------------------------------------------------------------------

BADPUT_CAUSES = ("startup", "checkpoint", "recovery", "wasted_step", "evaluation", "idle", "other")
_CAUSE_COLORS = ("#f0a202", "#7b68ee", "#c0392b", "#e67e22", "#16a085", "#5d6d7e", "#b0b0b0")


def goodput_chart(rows: Sequence[Mapping]) -> bytes:
    """Allocated device time split into productive time and badput by cause, in % of allocated
    seconds, one bar per stage and one for the run. `rows`: `goodput.Telemetry.as_row` plus `stage`."""
    keys = ("allocated_seconds", "productive_seconds", *(f"badput_{c}_seconds" for c in BADPUT_CAUSES))
    payload = {"rows": [{"stage": r["stage"], **{k: float(r[k]) for k in keys}} for r in rows]}
    return _render("goodput", payload)


def _draw_goodput(figure, p: dict) -> None:
    axes = figure.subplots()
    rows = [r for r in p["rows"] if r["allocated_seconds"] > 0]
    if not rows:
        _no_data(axes, "goodput and badput")
        return
    names = [r["stage"] for r in rows][::-1]  # the run last in the table, at the bottom of the chart
    left = [0.0] * len(rows)
    parts = [("productive", "productive_seconds", PASS)]
    parts += [(c, f"badput_{c}_seconds", color) for c, color in zip(BADPUT_CAUSES, _CAUSE_COLORS)]
    for label, key, color in parts:
        # "other" is what the log does not account for; a rounding residue below zero is not drawn
        shares = [max(0.0, 100 * r[key] / r["allocated_seconds"]) for r in rows][::-1]
        axes.barh(names, shares, left=left, color=color, label=label, height=0.6)
        left = [a + b for a, b in zip(left, shares)]
    for y, r in enumerate(rows[::-1]):
        axes.text(101, y, f"{100 * r['productive_seconds'] / r['allocated_seconds']:.0f}%", va="center", fontsize=7)
    axes.set_xlim(0, 110)
    _style(axes, "goodput and badput by cause (% of allocated device time)", "%")
    axes.legend(fontsize=6, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)


# Data: near-duplicates and contamination --------------------------------------------------------


def similarity_chart(counts: Sequence[int], threshold: float | None) -> bytes:
    """Candidate pairs by estimated Jaccard (equal-width bins over [0, 1]) with the removal threshold."""
    return _render("similarity", {"counts": [int(c) for c in counts], "threshold": threshold})


def _draw_similarity(figure, p: dict) -> None:
    axes = figure.subplots()
    counts = p["counts"]
    if not counts or not any(counts):
        _no_data(axes, "near-duplicate candidate pairs")
        return
    width = 1.0 / len(counts)
    threshold = p["threshold"]
    colors = [FAIL if threshold is not None and (i + 1) * width > threshold else NEUTRAL for i in range(len(counts))]
    axes.bar([i * width for i in range(len(counts))], counts, width=width, align="edge", color=colors)
    if threshold is not None:
        axes.axvline(threshold, color="black", linestyle="--", linewidth=1, label=f"threshold {threshold:g}")
        axes.legend(fontsize=7)
    axes.set_xlim(0, 1)
    _style(axes, "near-duplicate candidate pairs by estimated Jaccard", "estimated Jaccard", "pairs")


def contamination_chart(by_benchmark: Mapping[str, Mapping[str, int]]) -> bytes:
    """Contaminated documents and eval items hit, per benchmark. `by_benchmark`: name ->
    {"documents": n, "eval_items": n}."""
    payload = {"rows": {name: {"documents": int(v["documents"]), "eval_items": int(v["eval_items"])}
                        for name, v in by_benchmark.items()}}
    return _render("contamination", payload)


def _categories(figure, rows: Mapping, empty: str, names: list[str]) -> tuple | None:
    """One axes with a position per category name, or None after drawing `empty` when there is none."""
    axes = figure.subplots()
    if not rows:
        _no_data(axes, empty)
        return None
    return axes, names, list(range(len(names)))


def _draw_contamination(figure, p: dict) -> None:
    rows = p["rows"]
    if (found := _categories(figure, rows, "contamination by benchmark: none found", sorted(rows))) is None:
        return
    axes, names, ys = found
    axes.barh([y - 0.2 for y in ys], [rows[n]["documents"] for n in names], height=0.4, color=FAIL, label="documents")
    axes.barh([y + 0.2 for y in ys], [rows[n]["eval_items"] for n in names], height=0.4, color=MUTED, label="eval items")
    axes.set_yticks(ys, names)
    _style(axes, "contamination hits by benchmark", "count")
    axes.legend(fontsize=7)


# Decision and calibration -----------------------------------------------------------------------


def effect_chart(difference: float, low: float | None, high: float | None, verdict: str, *,
                 unit: str, minimum_detectable_effect: float | None = None) -> bytes:
    """The decision's effect (candidate better when positive) with its confidence interval against
    zero, and the smallest effect the seeds could detect, shaded either side of zero."""
    payload = {"difference": difference, "low": low, "high": high, "verdict": verdict, "unit": unit,
               "mde": minimum_detectable_effect}
    return _render("effect", payload)


def _draw_effect(figure, p: dict) -> None:
    axes = figure.subplots()
    difference = p["difference"]
    if difference is None or not math.isfinite(difference):
        _no_data(axes, f"effect: {p['verdict']}")
        return
    # An unbounded one is not drawn; a finite one at most across the widest axis.
    mde = min(abs(p["mde"]), _MAX_AXIS) if p["mde"] is not None and math.isfinite(p["mde"]) else 0.0
    if mde:
        axes.axvspan(-mde, mde, color=MUTED, alpha=0.2, label="below detectable effect")
    axes.axvline(0, color="black", linewidth=0.8)
    interval = [v for v in (p["low"], p["high"]) if v is not None and math.isfinite(v)]
    if len(interval) == 2:
        axes.errorbar([difference], [0], xerr=[[difference - interval[0]], [interval[1] - difference]], fmt="o",
                      color=NEUTRAL, capsize=6, label="difference, confidence interval")
    else:  # one seed: no interval
        axes.plot([difference], [0], "o", color=NEUTRAL, label="difference (no interval)")
    axes.set_yticks([])
    span = max([abs(v) for v in [difference, *interval, mde]] + [1e-9])
    axes.set_xlim(-_margin(span), _margin(span))
    _style(axes, f"data decision: {p['verdict']}", f"baseline - candidate ({p['unit']}); > 0 favours the candidate")
    axes.legend(fontsize=7, loc="upper left")


# The widest axis drawn: matplotlib's tick arithmetic overflows near a double's range (1e308).
# A value past it is off the axis, not an error.
_MAX_AXIS = 1e150


def _margin(span: float) -> float:
    """30 % beyond the largest value, at most _MAX_AXIS."""
    return min(span * 1.3, _MAX_AXIS)


def step_time_chart(stages: Mapping[str, tuple[float, float, bool]], flag_fraction: float) -> bytes:
    """Predicted and measured seconds per step for each stage (`stages`: name -> (predicted,
    measured, flagged as the calibration judged it)), with the band within which a measurement is
    not flagged. A time that is negative or not finite is a gap, as is a band that is."""
    payload = {"stages": {n: [_seconds(p), _seconds(m), bool(f)] for n, (p, m, f) in stages.items()},
               "flag": _seconds(flag_fraction)}
    return _render("step_time", payload)


def _seconds(value: float | None) -> float:
    """A duration to draw: NaN (a gap) where it cannot be one (negative, infinite, NaN or None)."""
    return float(value) if value is not None and math.isfinite(value) and value >= 0 else math.nan


def _draw_step_time(figure, p: dict) -> None:
    stages = p["stages"]
    if (found := _categories(figure, stages, "step time: no stage was timed", list(stages))) is None:
        return
    axes, names, xs = found
    predicted = [stages[n][0] for n in names]
    measured = [stages[n][1] for n in names]
    flag = p["flag"] if math.isfinite(p["flag"]) else 0.0
    band = [v * flag if math.isfinite(v * flag) else 0.0 for v in predicted]
    axes.errorbar([x - 0.2 for x in xs], predicted, yerr=[band] * 2, fmt="none",
                  ecolor=MUTED, capsize=8, label=f"±{flag:.0%} (not flagged)")
    axes.bar([x - 0.2 for x in xs], predicted, width=0.4, color=MUTED, alpha=0.6, label="predicted")
    flagged = [stages[n][2] for n in names]  # the check's verdict, not judged again from unrounded figures
    axes.bar([x + 0.2 for x in xs], measured, width=0.4, color=[FAIL if f else PASS for f in flagged], label="measured")
    axes.set_xticks(xs, names)
    _style(axes, "step time: price model against the run", "", "s/step")
    axes.legend(fontsize=7)


_DRAWERS: dict[str, Callable] = {
    "stage_loss": _draw_stage_loss, "curves": _draw_curves, "goodput": _draw_goodput,
    "similarity": _draw_similarity, "contamination": _draw_contamination, "effect": _draw_effect,
    "step_time": _draw_step_time,
}
