"""Jobs: every job in the window, sortable and filterable."""
from __future__ import annotations

import dash
from dash import Input, Output, callback, dash_table, html
from dash.dash_table.Format import Format, Group, Scheme, Symbol

from ..aggregate import from_rollups
from ..data import Analysis
from ..overview import Overview
from ..ui import early_parts, job_link, poll_fired, render_early

dash.register_page(__name__, path="/jobs", name="Jobs", title="burnrate · jobs", order=1)

_MONEY = Format(precision=2, scheme=Scheme.fixed, symbol=Symbol.yes, group=Group.yes)
COLUMNS = [
    {"name": "job", "id": "job", "presentation": "markdown"},
    {"name": "namespace", "id": "namespace"},
    {"name": "GPUs", "id": "gpus", "type": "numeric"},
    {"name": "capacity", "id": "capacity_type"},
    {"name": "GPU-hours", "id": "gpu_hours", "type": "numeric", "format": Format(precision=1, scheme=Scheme.fixed)},
    {"name": "cost so far", "id": "cost_dollars", "type": "numeric", "format": _MONEY},
    {"name": "$/h", "id": "dollars_per_hour", "type": "numeric", "format": _MONEY},
    {"name": "MFU", "id": "mfu", "type": "numeric", "format": Format(precision=1, scheme=Scheme.percentage)},
    {"name": "tokens/s", "id": "tokens_per_s", "type": "numeric",
     "format": Format(precision=0, scheme=Scheme.fixed, group=Group.yes)},
    {"name": "findings", "id": "findings", "type": "numeric"},
    {"name": "waste $", "id": "waste_dollars", "type": "numeric", "format": _MONEY},
]


def layout(**_query: str) -> html.Div:
    return html.Div([html.H2("Jobs"), *early_parts("jobs"), html.Div(id="jobs-content")])


@callback(Output("jobs-content", "children"), Output("jobs-progress", "children"), Output("jobs-poll", "disabled"),
          Input("app-url", "search"), Input("app-refresh", "n_intervals"), Input("jobs-poll", "n_intervals"))
def update(search: str | None, _n: int | None, polls: int | None = None):
    return render_early(search, content, early_content, poll_fired("jobs", polls))


def rows(a: Analysis | Overview, search: str) -> list[dict]:
    table = a.jobs.sort_values("cost_dollars", ascending=False, na_position="last")
    out = []
    for record in table.to_dict("records"):
        record["job"] = job_link(record["namespace"], record.pop("training_job"), search)
        out.append({k: (None if isinstance(v, float) and v != v else v) for k, v in record.items()})
    return out


def content(a: Analysis, search: str) -> list:
    rolled = len(from_rollups(a.report))
    basis = (f"tokens/s of the {rolled} jobs costed from roll-ups (fleet mode) is over the hours they held "
             "their GPUs, of the others over their ranks' reporting time. ") if rolled else ""
    return _table(rows(a, search), a.simulated, basis)


def early_content(o: Overview, search: str) -> list:
    """The jobs' GPU-hours and dollars from the overview's read; what needs the rank series or the
    detectors (MFU, tokens, findings, waste) stays blank until the analysis is done."""
    data = [row | {"findings": None, "waste_dollars": None} for row in rows(o, search)]
    basis = (f"Until the window's analysis is done: GPU-hours and cost from each GPU's held samples, as the "
             f"analysis counts them; GPUs at {o.step_text} means; MFU, tokens, findings and waste follow. ")
    return _table(data, o.simulated, basis)


def _table(data: list[dict], simulated: bool, basis: str) -> list:
    if not data:
        return [html.Div("No jobs held GPUs in this window.", className="br-notice")]
    note = "simulated data · " if simulated else ""
    return [
        html.P(f"{note}{len(data)} jobs. {basis}Click a column to sort; type in the row under the headers to filter "
               "(e.g. `> 100` under cost, `spot` under capacity).", className="br-hint", id="jobs-hint"),
        dash_table.DataTable(id="jobs-table", data=data, columns=COLUMNS, sort_action="native",
                             filter_action="native", page_size=25, markdown_options={"link_target": "_self"},
                             sort_by=[{"column_id": "cost_dollars", "direction": "desc"}],
                             style_cell={"textAlign": "left", "fontSize": 13}, style_as_list_view=True),
    ]
