"""Showback's renderings (docs/showback.md): a table to read, CSV and JSON for finance, and
one self-contained HTML page to mail (inline SVG, no script, no external URL)."""
from __future__ import annotations

import csv
import html
import io
import json
from typing import Any

from burnrate.exporter.errors import printable

from .showback import PeriodFigures

CSV_COLUMNS = ("period", "start", "end", "partial", "basis", "team", "jobs", "unpriced_jobs", "gpu_hours", "dollars",
               "spot_dollars", "on_demand_dollars", "waste_dollars", "goodput", "cost_per_billion_tokens",
               "dollars_change", "dollars_change_percent", "gpu_hours_change", "gpu_hours_change_percent",
               "change_reason")


def to_document(by: str, unit: str, figures: list[PeriodFigures], notes: list[str]) -> dict[str, Any]:
    return {"by": by, "period": unit, "notes": notes, "periods": [p.to_dict() for p in figures]}


def render_json(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"


def render_csv(doc: dict[str, Any]) -> str:
    """One row per period and team; the waste by cause as JSON text in one cell. With
    `--budgets`, a second section after a blank line: its own header, one row per team."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for period in doc["periods"]:
        for team in period["teams"]:
            dollars, hours = team["change"]["dollars"], team["change"]["gpu_hours"]
            writer.writerow({
                "period": period["period"], "start": period["start"], "end": period["end"],
                "partial": period["partial"], "basis": period["basis"],
                **{k: _cell(team[k]) for k in CSV_COLUMNS if k in team},
                "waste_dollars": json.dumps(team["waste_dollars"], sort_keys=True),
                "dollars_change": _cell(dollars["absolute"]), "dollars_change_percent": _cell(dollars["percent"]),
                "gpu_hours_change": _cell(hours["absolute"]), "gpu_hours_change_percent": _cell(hours["percent"]),
                "change_reason": _cell(dollars["reason"])})
    if "budgets" in doc:
        out.write("\n")
        writer = csv.DictWriter(out, fieldnames=BUDGET_CSV_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(budget_rows(doc["budgets"]))
    return out.getvalue()


BUDGET_CSV_COLUMNS = ("budget_period", "start", "as_of", "team", "budget_dollars", "spent_dollars", "share_spent",
                      "status", "forecast_low", "forecast_expected", "forecast_high", "interval_reason",
                      "crosses_on", "crosses_on_reason")


def budget_rows(block: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"budget_period": block["period"], "start": block["start"], "as_of": block["as_of"],
             **{k: _cell(team[k]) for k in BUDGET_CSV_COLUMNS if k in team},
             **{f"forecast_{k}": _cell(team["forecast"][k]) for k in ("low", "expected", "high")},
             "interval_reason": _cell(team["forecast"]["interval_reason"])} for team in block["teams"]]


def _cell(value: Any) -> Any:
    return "" if value is None else value


def team_rows(period: dict[str, Any]) -> list[list[str]]:
    rows = []
    for t in period["teams"]:
        change = t["change"]["dollars"]
        rows.append([t["team"], f"{t['gpu_hours']:,.1f}", f"{t['dollars']:,.2f}", f"{t['spot_dollars']:,.2f}",
                     f"{t['on_demand_dollars']:,.2f}", f"{sum(t['waste_dollars'].values()):,.2f}",
                     "-" if t["goodput"] is None else f"{t['goodput']:.1%}",
                     "-" if t["cost_per_billion_tokens"] is None else f"{t['cost_per_billion_tokens']:,.2f}",
                     "-" if change["absolute"] is None else f"{change['absolute']:+,.2f}",
                     "-" if change["percent"] is None else f"{change['percent']:+.1f}%"])
    return rows


HEADERS = ["TEAM", "GPU-H", "COST $", "SPOT $", "ON-DEMAND $", "WASTE $", "GOODPUT", "$/B TOKENS", "CHANGE $",
           "CHANGE %"]


def render_table(doc: dict[str, Any]) -> str:
    lines = [f"showback by {doc['by']}, per {doc['period']} (UTC)"] + [f"note: {n}" for n in doc["notes"]]
    for period in doc["periods"]:
        lines += ["", f"{period['period']}  {period['start']} → {period['end']}"
                  + (f"  (partial: {period['partial_reason']})" if period["partial"] else "")
                  + f"  teams ${period['dollars']:,.2f}, waste beyond the jobs ${period['beyond_jobs_waste_dollars']:,.2f}"]
        lines.append(f"basis: {basis_words(period)}")
        lines += [f"note: {n}" for n in period["notes"]]
        rows = team_rows(period)
        if not rows:
            lines.append("  no jobs")
            continue
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADERS)]
        for cells in [HEADERS, ["-" * w for w in widths]] + rows:
            lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                   for i, (c, w) in enumerate(zip(cells, widths))).rstrip())
        wasted = {}
        for t in period["teams"]:
            for kind, dollars in t["waste_dollars"].items():
                wasted[kind] = wasted.get(kind, 0.0) + dollars
        if wasted:
            lines.append("waste by cause: " + ", ".join(f"{k} ${v:,.2f}" for k, v in sorted(wasted.items())))
    return printable("\n".join(lines), keep="\n") + "\n"


def basis_words(period: dict[str, Any]) -> str:
    """Where the period's figures came from; each part's span where it has several."""
    parts = period["parts"]
    if len(parts) == 1:
        return parts[0]["basis"]
    return " and ".join(f"{p['basis']} ({p['start']} → {p['end']})" for p in parts)


def render_html(doc: dict[str, Any]) -> str:
    """The page: per period, a bar of each team's dollars (spot and on-demand) and the table;
    every figure carries its team and period so that it can be read back."""
    e = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>burnrate showback by {e(doc['by'])}</title>"
             "<style>body{font:14px sans-serif;margin:2em}table{border-collapse:collapse}"
             "td,th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}td:first-child{text-align:left}"
             ".spot{fill:#4c9f70}.od{fill:#3b6ea5}</style></head><body>",
             f"<h1>GPU showback by {e(doc['by'])}, per {e(doc['period'])} (UTC)</h1>"]
    parts += [f"<p class='note'>{e(n)}</p>" for n in doc["notes"]]
    for period in doc["periods"]:
        parts.append(f"<section class='period' data-period='{e(period['period'])}'>"
                     f"<h2>{e(period['period'])}{' (partial: ' + e(period['partial_reason']) + ')' if period['partial'] else ''}"
                     f" &mdash; teams ${period['dollars']:,.2f}, waste beyond the jobs "
                     f"${period['beyond_jobs_waste_dollars']:,.2f}</h2>")
        parts.append(f"<p class='basis'>basis: {e(basis_words(period))}</p>")
        parts += [f"<p class='note'>{e(n)}</p>" for n in period["notes"]]
        parts.append(_bars(period))
        parts.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in HEADERS) + "</tr>")
        for team, row in zip(period["teams"], team_rows(period)):
            parts.append(f"<tr class='team' data-team='{e(team['team'])}' data-dollars='{team['dollars']}'>"
                         + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>")
        parts.append("</table></section>")
    return "".join(parts) + "</body></html>\n"


def _bars(period: dict[str, Any], width: int = 600, bar: int = 22) -> str:
    """Horizontal bars, spot then on-demand, scaled to the period's largest team."""
    teams = period["teams"]
    if not teams:
        return "<p>no jobs</p>"
    top = max(t["dollars"] for t in teams) or 1.0
    label = 160
    rows = []
    for i, t in enumerate(teams):
        y = i * (bar + 6)
        spot = (width - label) * t["spot_dollars"] / top
        od = (width - label) * t["on_demand_dollars"] / top
        name = html.escape(t["team"])
        rows.append(f"<g class='bar' data-team='{name}' data-dollars='{t['dollars']}' "
                    f"data-spot='{t['spot_dollars']}' data-on-demand='{t['on_demand_dollars']}'>"
                    f"<text x='0' y='{y + bar - 6}'>{name}</text>"
                    f"<rect class='spot' x='{label}' y='{y}' width='{spot:.1f}' height='{bar}'/>"
                    f"<rect class='od' x='{label + spot:.1f}' y='{y}' width='{od:.1f}' height='{bar}'/>"
                    f"<title>{name}: ${t['dollars']:,.2f} (spot ${t['spot_dollars']:,.2f}, "
                    f"on-demand ${t['on_demand_dollars']:,.2f})</title></g>")
    return (f"<svg width='{width}' height='{len(teams) * (bar + 6)}'>"
            + "".join(rows) + "</svg>")
