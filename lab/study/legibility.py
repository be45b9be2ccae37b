"""Whether a rendered figure can be read: no label over another, no legend over the data, every
label inside the figure, and a name on every axis that shows numbers.

Pure functions of a matplotlib ``Figure``: :func:`problems` draws it once on an Agg canvas, at the
size and resolution it is saved at, and compares the drawn extents of its texts in display pixels.
A rotated label is compared as the rotated rectangle it occupies, not as its axis-aligned box (two
tick labels at 60° have overlapping boxes but do not touch). The figure tests of ``lab.study`` run
it on every figure a report shows.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.backend_bases import RendererBase
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import Collection, LineCollection
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.text import Text

TOLERANCE_PX = 1.0  # two labels that share less than this many pixels across their common edge do not overlap


@dataclass(frozen=True)
class Label:
    """A drawn text: what it says, where (``corners``: its rectangle's four corners in display
    pixels, in order around it), and what it is (``tick``, ``title``, ``legend``, ...)."""

    text: str
    corners: np.ndarray
    kind: str

    @property
    def box(self) -> tuple[float, float, float, float]:
        xs, ys = self.corners[:, 0], self.corners[:, 1]
        return float(xs.min()), float(ys.min()), float(xs.max()), float(ys.max())


def rectangle(center: tuple[float, float], width: float, height: float, degrees: float) -> np.ndarray:
    """The corners of a ``width`` × ``height`` rectangle centred on ``center``, turned by ``degrees``."""
    t = math.radians(degrees)
    rot = np.array([[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]])
    half = np.array([[-width, -height], [width, -height], [width, height], [-width, height]]) / 2
    return half @ rot.T + np.asarray(center, float)


def overlap(a: np.ndarray, b: np.ndarray, tolerance: float = TOLERANCE_PX) -> bool:
    """Whether two convex polygons (corners in order) overlap by more than ``tolerance`` pixels
    (the separating axis test: they are apart when some edge's normal separates their shadows)."""
    for poly in (a, b):
        for i in range(len(poly)):
            edge = poly[(i + 1) % len(poly)] - poly[i]
            normal = np.array([-edge[1], edge[0]])
            length = float(np.hypot(*normal))
            if length == 0:
                continue
            normal /= length
            pa, pb = a @ normal, b @ normal
            if min(pa.max(), pb.max()) - max(pa.min(), pb.min()) <= tolerance:
                return False
    return True


def _renderer(fig: Figure) -> RendererBase:
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def _label(text: Text, renderer: RendererBase, kind: str) -> Label:
    box = Text.get_window_extent(text, renderer)  # the text alone (an annotation's own box holds its arrow)
    degrees = text.get_rotation()
    if degrees % 90 == 0:
        corners = np.array([[box.x0, box.y0], [box.x1, box.y0], [box.x1, box.y1], [box.x0, box.y1]])
    else:  # its own width and height, turned about the centre of its drawn box
        text.set_rotation(0)
        flat = Text.get_window_extent(text, renderer)
        text.set_rotation(degrees)
        corners = rectangle(((box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2), flat.width, flat.height, degrees)
    return Label(text.get_text(), corners, kind)


def _shown(text: Text) -> bool:
    return text.get_visible() and bool(text.get_text().strip())


def _tick_labels(axis: Axis) -> Iterator[Text]:
    """The tick labels the axis draws: those of ticks inside its view."""
    lo, hi = sorted(axis.get_view_interval())
    for locs, ticks in ((axis.get_majorticklocs(), axis.get_major_ticks), (axis.get_minorticklocs(),
                                                                            axis.get_minor_ticks)):
        for loc, tick in zip(locs, ticks(len(locs)), strict=True):
            if lo - 1e-9 * max(1.0, abs(lo)) <= loc <= hi + 1e-9 * max(1.0, abs(hi)):
                yield from (t for t in (tick.label1, tick.label2) if _shown(t))


def labels(fig: Figure, renderer: RendererBase | None = None) -> list[Label]:
    """Every text the figure draws, each once: tick labels, axis labels, titles, annotations,
    legend entries and titles, the figure's own texts."""
    renderer = renderer or _renderer(fig)
    out: list[Label] = []
    seen: set[int] = set()

    def add(text: Text, kind: str) -> None:
        if id(text) not in seen and _shown(text):
            seen.add(id(text))
            out.append(_label(text, renderer, kind))

    legends: list[Legend] = list(fig.legends)
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        for axis in (ax.xaxis, ax.yaxis):
            for t in _tick_labels(axis):
                add(t, "tick")
            add(axis.get_offset_text(), "offset")
            add(axis.label, "axis label")
        for child in ax.get_children():
            if isinstance(child, Text):
                add(child, "title" if child in (ax.title,) else "annotation")
        legend = ax.get_legend()
        if legend is not None:
            legends.append(legend)
    for legend in legends:
        add(legend.get_title(), "legend")
        for t in legend.get_texts():
            add(t, "legend")
    for t in fig.texts:  # suptitle and supxlabel among them
        add(t, "figure text")
    return out


def overlapping(fig: Figure, renderer: RendererBase | None = None) -> list[tuple[str, str]]:
    """Pairs of drawn texts that lie over each other (by their texts)."""
    found = labels(fig, renderer)
    pairs = []
    for i, a in enumerate(found):
        ax0, ay0, ax1, ay1 = a.box
        for b in found[i + 1:]:
            bx0, by0, bx1, by1 = b.box
            if min(ax1, bx1) - max(ax0, bx0) <= TOLERANCE_PX or min(ay1, by1) - max(ay0, by0) <= TOLERANCE_PX:
                continue
            if overlap(a.corners, b.corners):
                pairs.append((a.text, b.text))
    return pairs


def outside(fig: Figure, renderer: RendererBase | None = None) -> list[str]:
    """Texts drawn (partly) beyond the figure's edges: cut off in the saved image."""
    w, h = fig.bbox.width, fig.bbox.height
    out = []
    for label in labels(fig, renderer):
        x0, y0, x1, y1 = label.box
        if x0 < -TOLERANCE_PX or y0 < -TOLERANCE_PX or x1 > w + TOLERANCE_PX or y1 > h + TOLERANCE_PX:
            out.append(label.text)
    return out


def _points(ax: Axes) -> np.ndarray:
    """Display points of what the axes shows as data: line vertices (and points along each segment),
    markers, segment ends, bar corners and centres. Background spans (a patch across the whole
    axes) and filled bands are not data points."""
    pts: list[np.ndarray] = []
    frame = ax.bbox
    for line in ax.lines:
        if not isinstance(line, Line2D) or not line.get_visible():
            continue
        xy = line.get_transform().transform(np.asarray(line.get_xydata(), float))
        xy = xy[np.isfinite(xy).all(axis=1)]
        if len(xy) > 1 and line.get_linestyle() not in ("None", "", " ", "none"):
            steps = np.linspace(0, 1, 25)[:, None]
            xy = np.vstack([a + steps * (b - a) for a, b in itertools.pairwise(xy)])
        pts.append(xy)
    for coll in ax.collections:
        if not isinstance(coll, Collection) or not coll.get_visible():
            continue
        if isinstance(coll, LineCollection):
            for seg in coll.get_segments():
                seg = np.asarray(seg, float)
                if len(seg):
                    pts.append(coll.get_transform().transform(seg))
            continue
        offsets = np.asarray(coll.get_offsets(), float)
        if offsets.size and len(coll.get_paths()) and offsets.shape[0] > 0 and not np.allclose(offsets, 0):
            pts.append(coll.get_offset_transform().transform(offsets))
    for patch in ax.patches:
        if not isinstance(patch, Rectangle) or not patch.get_visible():
            continue
        box = patch.get_window_extent()
        if box.width >= 0.95 * frame.width or box.height >= 0.95 * frame.height:
            continue  # a span behind the data
        pts.append(np.array([[box.x0, box.y0], [box.x1, box.y0], [box.x1, box.y1], [box.x0, box.y1],
                             [(box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2]]))
    if not pts:
        return np.empty((0, 2))
    xy = np.vstack(pts)
    xy = xy[np.isfinite(xy).all(axis=1)]
    inside = ((xy[:, 0] >= frame.x0) & (xy[:, 0] <= frame.x1) & (xy[:, 1] >= frame.y0) & (xy[:, 1] <= frame.y1))
    return xy[inside]


def legends_over_data(fig: Figure, renderer: RendererBase | None = None) -> list[str]:
    """Legends that cover a data point of some axes (by their first entry's text)."""
    renderer = renderer or _renderer(fig)
    legends: list[Legend] = list(fig.legends)
    legends += [leg for leg in (ax.get_legend() for ax in fig.axes) if leg is not None]
    out = []
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            xy = _points(ax)
            hit = ((xy[:, 0] > box.x0) & (xy[:, 0] < box.x1) & (xy[:, 1] > box.y0) & (xy[:, 1] < box.y1))
            if hit.any():
                texts = [t.get_text() for t in legend.get_texts()]
                out.append(texts[0] if texts else "(legend)")
                break
    return out


def unnamed_axes(fig: Figure, renderer: RendererBase | None = None) -> list[str]:
    """Axes that show numbers on an axis without saying what they are (no axis label); by their title.
    An axis of categories (pipeline names, sittings) names itself."""
    renderer = renderer or _renderer(fig)
    out = []
    for ax in fig.axes:
        if not ax.get_visible() or not ax.axison:
            continue
        for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            numbers = [t for t in _tick_labels(axis) if _numeric(t.get_text())]
            beside = [other for other in fig.axes if other is not ax and (_shares(ax, other, name)
                                                                          or _same_line(ax, other, name))]
            named = _shown(axis.label) or any(_shown((o.xaxis if name == "x" else o.yaxis).label) for o in beside)
            if numbers and not named:
                out.append(f"{ax.get_title() or 'axes'}: {name} axis")
    return out


def _numeric(text: str) -> bool:
    """A tick label that is a number ("1,000", "−0.5", "25 %", a log axis' "$10^{2}$"), not a category."""
    t = text.strip().replace("−", "-").replace(",", "").removesuffix("%").strip()
    if t.startswith("$"):
        return True
    try:
        float(t)
    except ValueError:
        return False
    return True


def _same_line(ax: Axes, other: Axes, axis: str) -> bool:
    """Whether ``other`` sits in the same row of a grid (for y; the same column for x): small
    multiples name a row's y axis once, at its left."""
    a, b = ax.get_subplotspec(), other.get_subplotspec()
    if a is None or b is None or a.get_gridspec() is not b.get_gridspec():
        return False
    return a.rowspan == b.rowspan if axis == "y" else a.colspan == b.colspan


def _shares(ax: Axes, other: Axes, axis: str) -> bool:
    group = ax.get_shared_x_axes() if axis == "x" else ax.get_shared_y_axes()
    return bool(group.joined(ax, other))


def problems(fig: Figure) -> list[str]:
    """Everything that keeps a reader from reading ``fig``, one line each (empty: legible)."""
    renderer = _renderer(fig)
    out = [f"labels over each other: {a!r} and {b!r}" for a, b in overlapping(fig, renderer)]
    out += [f"label cut off at the figure's edge: {t!r}" for t in outside(fig, renderer)]
    out += [f"legend over the data: {t!r}" for t in legends_over_data(fig, renderer)]
    out += [f"no name on the {t}" for t in unnamed_axes(fig, renderer)]
    return out
