"""The HTML plan report: one self-contained page (inline CSS and SVG, no script needed, nothing
fetched), laid out to wrap rather than overflow at any width: long commands and tensor names break,
the layer map is a wrapping grid, each memory bar is an SVG scaled to its container."""
from __future__ import annotations

from html import escape

from planner.emit.plan_report import Bar, LayerCell, Report

# the three parts of a bar, as llama.cpp's memory breakdown names them, and their colours
PARTS = (("model", "#4e79a7"), ("context", "#f28e2b"), ("compute", "#59a14f"),
         ("overhead outside llama.cpp's breakdown", "#bab0ac"))
# one colour per device row, in order; Host keeps grey
DEVICE_COLOURS = ("#4e79a7", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#59a14f")
HOST_COLOUR = "#9e9e9e"

CSS = """
*, *::before, *::after { box-sizing: border-box; }
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #222; margin: 0;
       background: #fafafa; }
main { max-width: 1100px; margin: 0 auto; padding: 16px; }
h1 { font-size: 1.4em; margin: 0 0 8px; overflow-wrap: anywhere; }
h2 { font-size: 1.1em; margin: 24px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
section { background: #fff; border: 1px solid #e4e4e4; border-radius: 6px; padding: 8px 14px 12px;
          margin-bottom: 12px; }
dl.facts { display: grid; grid-template-columns: max-content minmax(0, 1fr); gap: 2px 14px; margin: 0; }
dl.facts dt { color: #666; }
dl.facts dd { margin: 0; overflow-wrap: anywhere; min-width: 0; }
.bar { margin: 10px 0; }
.bar .label { display: flex; flex-wrap: wrap; justify-content: space-between; gap: 4px 12px; }
.bar .label b { overflow-wrap: anywhere; }
.bar svg { display: block; width: 100%; height: 26px; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 16px; margin: 6px 0; }
.legend span::before { content: ""; display: inline-block; width: 12px; height: 12px; margin-right: 5px;
                       vertical-align: -1px; background: var(--c); }
.over { color: #b00020; font-weight: 600; }
.layers { display: flex; flex-wrap: wrap; gap: 3px; margin: 6px 0; }
.layers .cell { min-width: 34px; height: 30px; padding: 0 3px; border-radius: 3px; color: #fff; font-size: 12px;
                display: flex; align-items: center; justify-content: center; background: var(--c);
                position: relative; }
.layers .cell.moved { outline: 2px dashed #222; outline-offset: -3px; }
table { border-collapse: collapse; width: 100%; table-layout: fixed; }
th, td { text-align: left; padding: 3px 6px; border-bottom: 1px solid #eee; overflow-wrap: anywhere; }
td.num, th.num { text-align: right; }
.scroll { max-width: 100%; overflow-x: auto; }
pre { white-space: pre-wrap; overflow-wrap: anywhere; background: #f3f3f3;
      padding: 8px; border-radius: 4px; margin: 4px 0 10px; font-size: 13px; user-select: all; }
ul { padding-left: 20px; margin: 4px 0; }
li { overflow-wrap: anywhere; }
@media (max-width: 600px) {
  body { font-size: 14px; }
  main { padding: 8px; }
  section { padding: 6px 8px 10px; }
  table { font-size: 12px; }
  th, td { padding: 2px 3px; }
}
"""


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def _colours(report: Report) -> dict[str, str]:
    names = [b.name for b in report.bars if b.name not in ("Host", "CPU_REPACK")]
    out = {name: DEVICE_COLOURS[i % len(DEVICE_COLOURS)] for i, name in enumerate(names)}
    return {**out, "Host": HOST_COLOUR, "CPU_REPACK": HOST_COLOUR}


def _bar(bar: Bar) -> str:
    """One row: its parts stacked left to right against its own budget (the full width, or a line
    inside when the row is over it), on a 1000-unit-wide SVG."""
    scale = max(bar.total_bytes, bar.budget_bytes or 0, 1)
    x, rects = 0.0, []
    for (part, colour), n in zip(PARTS, (bar.model_bytes, bar.context_bytes, bar.compute_bytes, bar.overhead_bytes),
                                   strict=True):
        width = 1000 * n / scale
        if width > 0:
            rects.append(f'<rect x="{x:.1f}" y="3" width="{width:.1f}" height="20" fill="{colour}">'
                         f'<title>{part}: {_mib(n)}</title></rect>')
        x += width
    if bar.budget_bytes is not None:
        bx = min(1000 * bar.budget_bytes / scale, 999.0)
        rects.append(f'<line x1="{bx:.1f}" y1="0" x2="{bx:.1f}" y2="26" stroke="#222" stroke-width="3">'
                     f'<title>budget: {_mib(bar.budget_bytes)}</title></line>')
    used = bar.total_bytes
    if bar.budget_bytes is None:
        verdict = f"{_mib(used)} (no budget of its own)"
    elif used > bar.budget_bytes:
        verdict = f'<span class="over">{_mib(used)} of {_mib(bar.budget_bytes)}: over</span>'
    else:
        verdict = f"{_mib(used)} of {_mib(bar.budget_bytes)}"
    return (f'<div class="bar"><div class="label"><b>{escape(bar.name)}</b><span>{verdict}</span>'
            f'<span>{escape(bar.note)}</span></div>'
            f'<svg viewBox="0 0 1000 26" preserveAspectRatio="none" role="img" '
            f'aria-label="{escape(bar.name)} memory">'
            f'<rect x="0" y="3" width="1000" height="20" fill="#eee"/>{"".join(rects)}</svg></div>')


def _memory(report: Report) -> str:
    legend = "".join(f'<span style="--c:{c}">{p}</span>' for p, c in PARTS)
    legend += '<span style="--c:#222">budget (line)</span>'
    rows = "".join(
        f'<tr><td>{escape(b.name)}</td><td class="num">{_mib(b.model_bytes)}</td>'
        f'<td class="num">{_mib(b.context_bytes)}</td><td class="num">{_mib(b.compute_bytes)}</td>'
        f'<td class="num">{_mib(b.overhead_bytes)}</td><td class="num">{_mib(b.total_bytes)}</td>'
        f'<td class="num">{"-" if b.budget_bytes is None else _mib(b.budget_bytes)}</td></tr>'
        for b in report.bars)
    table = ('<div class="scroll"><table><thead><tr><th>device</th><th class="num">model</th>'
             '<th class="num">context</th><th class="num">compute</th><th class="num">overhead</th>'
             '<th class="num">total</th>'
             f'<th class="num">budget</th></tr></thead><tbody>{rows}</tbody></table></div>')
    bars = "".join(_bar(b) for b in report.bars)
    return f'<section id="memory"><h2>Memory per device</h2><div class="legend">{legend}</div>{bars}{table}</section>'


def _cell(cell: LayerCell, colours: dict[str, str]) -> str:
    label = "out" if cell.index is None else str(cell.index)
    name = "output layer" if cell.index is None else f"layer {cell.index}"
    moved = "; ".join(f"{t} on {d}" for t, d in cell.moved)
    title = f"{name}: {cell.device}" + (f"; moved: {moved}" if moved else "")
    css = "cell moved" if cell.moved else "cell"
    return (f'<div class="{css}" style="--c:{colours.get(cell.device, HOST_COLOUR)}" '
            f'title="{escape(title)}" data-device="{escape(cell.device)}">{label}</div>')


def _moved_groups(report: Report) -> list[tuple[str, tuple[str, ...], str]]:
    """Moved tensors as (layers, tensor names without `blk.N.`, device), one entry per run of
    consecutive layers that move the same tensors to the same place; tensors of no layer as they are."""
    runs: list[tuple[list[int], tuple[str, ...], str]] = []
    for cell in report.layers:
        if cell.index is None or not cell.moved:
            continue
        by_device: dict[str, list[str]] = {}
        for tensor, dev in cell.moved:
            by_device.setdefault(dev, []).append(tensor.split(".", 2)[2])
        for dev, names in by_device.items():
            last = runs[-1] if runs else None
            if last and last[1] == tuple(names) and last[2] == dev and last[0][-1] == cell.index - 1:
                last[0].append(cell.index)
            else:
                runs.append(([cell.index], tuple(names), dev))
    out = [(f"layer {ids[0]}" if len(ids) == 1 else f"layers {ids[0]}-{ids[-1]}", names, dev)
           for ids, names, dev in runs]
    return out + [("not in a layer", (t,), d) for t, d in report.moved_elsewhere]


def _layer_map(report: Report) -> str:
    colours = _colours(report)
    used = list(dict.fromkeys(c.device for c in report.layers))
    legend = "".join(f'<span style="--c:{colours.get(d, HOST_COLOUR)}">{escape(d)}</span>' for d in used)
    cells = "".join(_cell(c, colours) for c in report.layers)
    moved = _moved_groups(report)
    moved_list = ("<p>Tensors an override keeps elsewhere than their layer (dashed cells):</p><ul>"
                  + "".join(f"<li>{escape(where)}: <code>{escape(', '.join(names))}</code> on {escape(dev)}</li>"
                            for where, names, dev in moved) + "</ul>"
                  if moved else "<p>No tensor is moved from its layer's device.</p>")
    return (f'<section id="layers"><h2>Layer map</h2><div class="legend">{legend}</div>'
            f'<div class="layers">{cells}</div>{moved_list}</section>')


def _facts(pairs: tuple[tuple[str, str], ...]) -> str:
    return '<dl class="facts">' + "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in pairs) + "</dl>"


def _list(section: str, title: str, lines: tuple[str, ...]) -> str:
    items = "".join(f"<li>{escape(line)}</li>" for line in lines) or "<li>nothing to add</li>"
    return f'<section id="{section}"><h2>{title}</h2><ul>{items}</ul></section>'


def plan_sections(report: Report) -> str:
    """The plan's sections after its summary: memory, layer map, speeds, commands, why, what would fit."""
    parts = [_memory(report)]
    if not report.infeasible:
        parts.append(_layer_map(report))
        parts.append(f'<section id="speeds"><h2>Predicted speeds</h2>{_facts(report.speeds)}</section>')
        commands = "".join(f"<p>{escape(label)}:</p><pre>{escape(line)}</pre>" for label, line in report.commands)
        parts.append(f'<section id="commands"><h2>Commands</h2>{commands}</section>')
        parts.append(_list("why", "Why (--explain)", report.why))
    parts.append(_list("what-fits", "What would fit", report.what_fits))
    return "".join(parts)


def page(title: str, body: str) -> str:
    """A whole page around `body`: the stylesheet inline, nothing fetched."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{escape(title)}</title><style>{CSS}</style></head>"
            f"<body><main>{body}</main></body></html>\n")


def summary(report: Report) -> str:
    return f'<section id="summary"><h1>{escape(report.title)}</h1>{_facts(report.facts)}</section>'


def render_html(report: Report) -> str:
    return page(report.title, summary(report) + plan_sections(report))
