"""A set plan as one self-contained HTML page (`fitplan plan-set --html FILE`): the models and where
each is loaded, the on-demand loads, each state of the box (the models loaded together) as one bar per
device row stacked by model against its budget, then each model's own plan as `fitplan plan --html`
draws it. An infeasible set gets a page with its message and suggestions."""
from __future__ import annotations

from html import escape
from typing import Any

from planner.core.errors import InfeasiblePlacement
from planner.core.units import fmt_bytes
from planner.emit.plan_report import plan_report
from planner.emit.plan_report_html import DEVICE_COLOURS, page, plan_sections
from planner.search.set_plan import SetPlan


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def _facts(pairs: list[tuple[str, str]]) -> str:
    return '<dl class="facts">' + "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in pairs) + "</dl>"


def _bar(row: dict[str, Any], colours: dict[str, str]) -> str:
    """One device row of a state: each model's bytes stacked, the budget a line, on a 1000-unit SVG."""
    budget = row["budget_bytes"]
    scale = max(row["total_bytes"], budget or 0, 1)
    x, parts = 0.0, []
    for name, n in row["models"].items():
        width = 1000 * n / scale
        if width > 0:
            parts.append(f'<rect x="{x:.1f}" y="3" width="{width:.1f}" height="20" fill="{colours[name]}">'
                         f'<title>{escape(name)}: {_mib(n)}</title></rect>')
        x += width
    if budget is not None:
        bx = min(1000 * budget / scale, 999.0)
        parts.append(f'<line x1="{bx:.1f}" y1="0" x2="{bx:.1f}" y2="26" stroke="#222" stroke-width="3"/>')
    used = _mib(row["total_bytes"]) + ("" if budget is None else f" of {_mib(budget)}")
    over = budget is not None and row["total_bytes"] > budget
    verdict = f'<span class="over">{used}: over</span>' if over else used
    return (f'<div class="bar"><div class="label"><b>{escape(row["name"])}</b><span>{verdict}</span></div>'
            f'<svg viewBox="0 0 1000 26" preserveAspectRatio="none" role="img" '
            f'aria-label="{escape(row["name"])} memory"><rect x="0" y="3" width="1000" height="20" fill="#eee"/>'
            f'{"".join(parts)}</svg></div>')


def _state(state: dict[str, Any], colours: dict[str, str]) -> str:
    legend = "".join(f'<span style="--c:{colours[n]}">{escape(n)}</span>' for n in state["models"])
    bars = "".join(_bar(r, colours) for r in state["devices"])
    return (f'<section><h2>Loaded together: {escape(", ".join(state["models"]))}</h2>'
            f'<div class="legend">{legend}</div>{bars}</section>')


def set_html(plan: SetPlan, doc: dict[str, Any]) -> str:
    colours = {m["name"]: DEVICE_COLOURS[i % len(DEVICE_COLOURS)] for i, m in enumerate(doc["models"])}
    facts = [(m["name"], f"{m['role']}, {'resident' if m['resident'] else 'on demand'}, context {m['ctx']}, "
              f"{m['n_parallel']} slot(s)") for m in doc["models"]]
    facts += [(f"on demand {o['unit']}", f"loads {fmt_bytes(o['load_bytes'])}"
               + ("" if o["load_seconds"] is None else f" ({o['load_seconds']:.1f} s)")
               + f"; evicts {', '.join(o['evicts']) or 'nothing'}") for o in doc["on_demand"]]
    body = [f'<section id="summary"><h1>Model set {escape(doc["source"])}</h1>{_facts(facts)}</section>']
    body += [_state(s, colours) for s in doc["sets"]]
    for p in plan.models:
        body.append(f'<h2 id="model-{escape(p.entry.name)}">{escape(p.entry.name)}: its plan</h2>')
        renamed = [f"its {mine} is the box's {box}" for mine, box in p.names if mine != box]
        if renamed:   # llama.cpp numbers each process's RPC devices in its own --rpc order
            body.append(f"<p>Device names as its llama-server sees them: {escape('; '.join(renamed))}.</p>")
        body.append(plan_sections(plan_report(p.result)))
    return page(f"Model set {doc['source']}", "".join(body))


def infeasible_set_html(source: str, error: InfeasiblePlacement) -> str:
    hints = "".join(f"<li>{escape(s.text)}</li>" for s in error.suggestions) or "<li>nothing found</li>"
    return page(f"Model set {source}", f'<section id="summary"><h1>Model set {escape(source)}</h1>'
                f'<p class="over">{escape(str(error))}</p></section>'
                f'<section id="what-fits"><h2>What would fit</h2><ul>{hints}</ul></section>')
