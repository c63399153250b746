"""A picture of a plan's schedule, as the simulator priced it (``diviml plan --gantt PATH``).

Latency plans draw a Gantt chart: a row per device that ran kernels, a row per link that carried
tensors, a thin line from each producer's finish to the start of its transfer, and the makespan.
Period plans (period_overlap, host_staged) draw each device's and link's load per inference
against the period; stage_serial plans draw one bar per pipeline stage. A bar's solid part is
compute and its lighter, hatched part is communication, so a bottleneck shows which it is.

matplotlib is imported inside ``draw_schedule`` (the library imports without it), and only its
object-oriented API is used (no pyplot): drawing changes no global backend or figure state.
Each row is one collection however many bars it has, so thousands of kernels draw in seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .cost.base import CostModel
from .errors import DivimlInputError
from .graph import OpGraph
from .plan import Plan
from .platform import Platform
from .simulator import Simulation
from .units import format_seconds
from .writes import written_whole

MAX_LABELLED_KERNELS = 300  # above this, no kernel names: they would be unreadable and slow
LABEL_FONT_PT = 7.0
FIGURE_WIDTH_IN = 12.0
ROW_HEIGHT_IN = 0.35
MAX_FIGURE_HEIGHT_IN = 30.0
DPI = 100


@dataclass
class Drawing:
    """What was drawn, so that callers and tests can check the content and not only the file."""

    mode: str
    rows: list[str]  # row labels, top to bottom
    bars: dict[str, int] = field(default_factory=dict)  # bars per row
    busy_s: dict[str, float] = field(default_factory=dict)  # total bar length per row
    compute_s: dict[str, float] = field(default_factory=dict)  # the compute part of it
    labels: int = 0  # kernel names written on bars
    arrows: int = 0  # producer-to-transfer lines
    artists: int = 0  # artists on the axes: few, whatever the size


def link_label(src: str, dst: str) -> str:
    return f"{src} \u2192 {dst}"


def draw_schedule(
    graph: OpGraph,
    platform: Platform,
    costs: CostModel,
    plan: Plan,
    sim: Simulation,
    path: str,
    title: str | None = None,
) -> Drawing:
    """Draw ``sim`` (the simulation of ``plan``) to the image file ``path`` (PNG unless its suffix says
    otherwise); return what was drawn. ``title`` replaces the default first title line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not math.isfinite(sim.value_s):
        raise DivimlInputError(
            f"the plan's {_value_name(sim)} is infinite: there is no schedule to draw",
            field="assignment",
            hint="a kernel sits on a device that cannot run it",
        )
    heading = title or f"{graph.name} on {platform.name}: {plan.solver or 'plan'} ({sim.mode})"
    figure = Figure(figsize=(FIGURE_WIDTH_IN, 4.0), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    if sim.mode == "latency":
        drawing = _draw_latency(axes, platform, plan, sim)
    else:
        drawing = _draw_loads(axes, platform, costs, plan, sim)
    value = f"{_value_name(sim)} {format_seconds(sim.value_s)}"
    if sim.mode != "latency" and sim.value_s > 0:
        value += f" ({1 / sim.value_s:.3g} inferences/s)"
    axes.set_title(f"{heading}\n{value}")
    height = min(MAX_FIGURE_HEIGHT_IN, 1.5 + ROW_HEIGHT_IN * max(len(drawing.rows), 1))
    figure.set_size_inches(FIGURE_WIDTH_IN, height)
    drawing.artists = len(axes.get_children())
    with written_whole(path, "the picture") as temporary:  # a file that cannot be written: one line
        try:
            figure.savefig(temporary)
        except ValueError as error:  # matplotlib's "Format 'xyz' is not supported"
            raise DivimlInputError(f"cannot draw: {error}", source=path, hint="name a .png file") from None
    return drawing


def _value_name(sim: Simulation) -> str:
    return "makespan" if sim.mode == "latency" else "period"


def _time_unit(span_s: float) -> tuple[str, float]:
    """The axis unit for a time span: the largest of s, ms, us that keeps numbers >= 1."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if span_s >= scale:
            return unit, scale
    return "ns", 1e-9


def _device_colours(platform: Platform) -> dict[str, tuple]:
    from matplotlib import colormaps

    palette = colormaps["tab10" if len(platform.devices) <= 10 else "tab20"]
    return {d.name: palette(i % palette.N) for i, d in enumerate(platform.devices)}


def _in_platform_order(links, platform: Platform) -> list[tuple[str, str]]:
    position = {name: index for index, name in enumerate(platform.device_names)}
    return sorted(links, key=lambda link: (position[link[0]], position[link[1]]))


def _shorten(name: str, chars: int) -> str | None:
    """``name`` in at most ``chars`` characters, keeping its head and tail; None when too few fit."""
    if len(name) <= chars:
        return name
    if chars < 4:
        return None
    tail = (chars - 1) // 3
    return name[: chars - 1 - tail] + "\u2026" + (name[-tail:] if tail else "")


# ---------------------------------------------------------------------- latency: a Gantt chart
def _draw_latency(axes, platform: Platform, plan: Plan, sim: Simulation) -> Drawing:
    from matplotlib.collections import LineCollection

    colours = _device_colours(platform)
    unit, scale = _time_unit(sim.value_s)
    by_device: dict[str, list[str]] = {}
    for kernel in sorted(sim.start_s, key=sim.start_s.__getitem__):
        by_device.setdefault(plan.assignment[kernel], []).append(kernel)
    devices = [d for d in platform.device_names if d in by_device]
    by_link: dict[tuple[str, str], list] = {}
    for transfer in sim.transfers:
        by_link.setdefault((transfer.src, transfer.dst), []).append(transfer)
    links = _in_platform_order(by_link, platform)
    rows = devices + [link_label(*link) for link in links]
    drawing = Drawing(sim.mode, rows)
    row_of = {name: index for index, name in enumerate(rows)}

    labelled = len(sim.start_s) <= MAX_LABELLED_KERNELS
    axes_px = FIGURE_WIDTH_IN * DPI * 0.85
    char_px = 0.6 * LABEL_FONT_PT / 72 * DPI
    seconds_per_char = max(sim.value_s, 1e-30) * char_px / axes_px
    for device in devices:
        kernels = by_device[device]
        spans = [(sim.start_s[k] / scale, (sim.finish_s[k] - sim.start_s[k]) / scale) for k in kernels]
        axes.broken_barh(
            spans, (row_of[device] - 0.4, 0.8), facecolors=colours[device], edgecolors="white", linewidth=0.3
        )
        busy = sum(sim.finish_s[k] - sim.start_s[k] for k in kernels)
        drawing.bars[device] = len(kernels)
        drawing.busy_s[device] = drawing.compute_s[device] = busy
        if not labelled:
            continue
        for kernel in kernels:
            text = _shorten(kernel, int((sim.finish_s[kernel] - sim.start_s[kernel]) / seconds_per_char))
            if text:
                axes.text(
                    (sim.start_s[kernel] + sim.finish_s[kernel]) / 2 / scale,
                    row_of[device],
                    text,
                    ha="center",
                    va="center",
                    fontsize=LABEL_FONT_PT,
                    clip_on=True,
                )
                drawing.labels += 1

    segments = []
    for link in links:
        label = link_label(*link)
        transfers = by_link[link]
        axes.broken_barh(
            [(t.start_s / scale, (t.end_s - t.start_s) / scale) for t in transfers],
            (row_of[label] - 0.3, 0.6),
            facecolors=colours[link[0]],
            alpha=0.55,
            edgecolors="black",
            linewidth=0.3,
            hatch="//",
        )
        drawing.bars[label] = len(transfers)
        drawing.busy_s[label] = sum(t.end_s - t.start_s for t in transfers)
        drawing.compute_s[label] = 0.0
        for t in transfers:
            if t.src in row_of:  # a model input sent from a host that runs no kernel has no row
                produced = sim.finish_s.get(t.tensor, 0.0)
                segments.append([(produced / scale, row_of[t.src]), (t.start_s / scale, row_of[label])])
    if segments:
        faint = len(segments) > MAX_LABELLED_KERNELS  # a dense web of lines would hide the bars
        axes.add_collection(LineCollection(segments, colors="0.35", linewidths=0.5, alpha=0.2 if faint else 0.7))
    drawing.arrows = len(segments)

    axes.axvline(sim.value_s / scale, color="black", linestyle="--", linewidth=1.0)
    axes.set_xlim(0, sim.value_s / scale * 1.02 or 1.0)
    axes.set_yticks(range(len(rows)), rows)
    axes.set_ylim(len(rows) - 0.5, -0.5)  # first row on top
    axes.set_xlabel(f"time ({unit})")
    axes.grid(axis="x", linewidth=0.3, alpha=0.5)
    return drawing


# ---------------------------------------------------------------------- period modes: loads against the period
def _draw_loads(axes, platform: Platform, costs: CostModel, plan: Plan, sim: Simulation) -> Drawing:
    """One bar per device and per busy link (period_overlap, host_staged) or per stage (stage_serial)."""
    from matplotlib.patches import Patch

    colours = _device_colours(platform)
    bars: list[tuple[str, float, float, tuple]] = []  # (row, total, compute part, colour)
    if sim.mode == "stage_serial":
        for index, (stage, total) in enumerate(zip(plan.stages, sim.stage_cost_s)):
            device = (
                plan.stage_devices[index]
                if plan.stage_devices
                else (plan.assignment[stage[0]] if stage else platform.host)
            )
            compute = sum(costs.compute_s(kernel, device) for kernel in stage)
            count = f"{len(stage)} kernel{'' if len(stage) == 1 else 's'}"
            bars.append((f"stage {index}: {device} ({count})", total, compute, colours[device]))
    else:
        compute = _compute_per_device(costs, plan, sim)
        for device in platform.device_names:
            if device in sim.device_busy_s:
                bars.append((device, sim.device_busy_s[device], compute.get(device, 0.0), colours[device]))
        for link in _in_platform_order(sim.link_busy_s, platform):
            if sim.link_busy_s[link] > 0:
                bars.append((link_label(*link), sim.link_busy_s[link], 0.0, colours[link[0]]))

    unit, scale = _time_unit(sim.value_s)
    rows = [row for row, *_ in bars]
    drawing = Drawing(sim.mode, rows, bars={row: 1 for row in rows})
    computed = [min(part, total) for _, total, part, _ in bars]
    talked = [total - part for (_, total, _, _), part in zip(bars, computed)]
    colour_list = [colour for *_, colour in bars]
    positions = range(len(bars))
    axes.barh(positions, [c / scale for c in computed], color=colour_list, height=0.7)
    axes.barh(
        positions,
        [t / scale for t in talked],
        left=[c / scale for c in computed],
        color=colour_list,
        alpha=0.45,
        hatch="//",
        edgecolor="black",
        linewidth=0.3,
        height=0.7,
    )
    for (row, total, _, _), part in zip(bars, computed):
        drawing.busy_s[row], drawing.compute_s[row] = total, part
    period = axes.axvline(sim.value_s / scale, color="black", linestyle="--", linewidth=1.0, label="period")
    axes.legend(
        handles=[
            Patch(facecolor="0.5", label="compute"),
            Patch(facecolor="0.5", alpha=0.45, hatch="//", label="communication"),
            period,
        ],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=8,
    )
    axes.set_yticks(list(positions), rows)
    axes.set_ylim(len(rows) - 0.5, -0.5)
    axes.set_xlim(0, sim.value_s / scale * 1.05 or 1.0)
    axes.set_xlabel(f"time per inference ({unit})")
    axes.grid(axis="x", linewidth=0.3, alpha=0.5)
    return drawing


def _compute_per_device(costs: CostModel, plan: Plan, sim: Simulation) -> dict[str, float]:
    """The compute part of each device's load; the rest of it is communication."""
    if sim.mode == "period_overlap":
        return dict(sim.device_busy_s)  # this mode charges every transfer to a link, not a device
    compute: dict[str, float] = {}
    for kernel, device in plan.assignment.items():
        compute[device] = compute.get(device, 0.0) + costs.compute_s(kernel, device)
    return compute
