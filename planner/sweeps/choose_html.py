"""`fitplan choose --html`: the comparison as one self-contained page — the summary and the
recommendation, the table, one section per candidate (its facts and its llama-server line, or why it
has no plan), then the recommended file's plan as `fitplan plan --html` draws it."""
from __future__ import annotations

from html import escape

from planner.core.units import fmt_bytes
from planner.emit.plan_report import plan_report
from planner.emit.plan_report_html import page, plan_sections
from planner.search.result import server_command
from planner.sweeps.choose import Choice, Row, choice_table_rows

TITLE = "Which file to download"


def _facts(pairs: list[tuple[str, str]]) -> str:
    return '<dl class="facts">' + "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in pairs) + "</dl>"


def _candidate(i: int, row: Row, marks: str) -> str:
    p = row.plan
    facts = [("files", ", ".join(row.candidate.files)), ("file type (header)", row.file_type or "-")]
    if row.n_params:
        facts += [("size", fmt_bytes(row.size_bytes)), ("bits per weight", f"{row.bits_per_weight:.2f}")]
    if row.candidate.mmproj:
        facts.append(("projector llama.cpp pairs", row.candidate.mmproj))
    if p is None:
        facts.append((row.verdict, row.problem))
    else:
        facts += [("runs on", row.runs_on), ("context", str(p.n_ctx)),
                  ("predicted decode", f"{p.prediction.decode_tokens_s:.1f} tokens/s"),
                  ("predicted prefill", f"{p.prediction.prefill_tokens_s:.0f} tokens/s")]
    if row.largest_ctx:
        facts.append(("largest context", str(row.largest_ctx)))
    command = f"<p>run it:</p><pre>{escape(server_command(p))}</pre>" if p is not None else ""
    title = f"{row.candidate.label}" + (f" ({marks})" if marks else "")
    return f'<section id="candidate-{i}"><h2>{escape(title)}</h2>{_facts(facts)}{command}</section>'


def _table(choice: Choice) -> str:
    head, rows = choice_table_rows(choice)
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return (f'<section id="candidates"><h2>Candidates</h2><div class="scroll"><table><thead><tr>{th}</tr></thead>'
            f"<tbody>{body}</tbody></table></div><p>Quality is stated as the quantization and its bits per weight."
            "</p></section>")


def choice_html(choice: Choice) -> str:
    rec = choice.recommended
    facts = [("listed from", ", ".join(choice.sources)), ("candidates", str(len(choice.rows)))]
    if choice.best is not None and choice.fastest is not None:
        facts += [("highest precision that fits", choice.rows[choice.best].candidate.label),
                  ("fastest", choice.rows[choice.fastest].candidate.label)]
    else:
        facts.append(("recommendation", "no candidate plans under these budgets and constraints"))
    parts = [f'<section id="summary"><h1>{escape(TITLE)}</h1>{_facts(facts)}</section>', _table(choice)]
    if choice.projectors:
        items = "".join(f"<li>{escape(p.path)}</li>" for p in choice.projectors)
        parts.append(f'<section id="projectors"><h2>Projectors</h2><ul>{items}</ul></section>')
    for i, row in enumerate(choice.rows):
        marks = ", ".join(m for m, j in (("highest precision", choice.best), ("fastest", choice.fastest)) if i == j)
        parts.append(_candidate(i, row, marks))
    if rec is not None:
        report = plan_report(rec)
        label = choice.rows[choice.best or 0].candidate.label
        parts.append(f'<section id="recommended"><h2>The plan for {escape(label)}</h2>'
                     f"{_facts(list(report.facts))}</section>")
        parts.append(plan_sections(report))
    return page(TITLE, "".join(parts))
