"""The Cost page's budgets (docs/dashboard.md, docs/budgets.md) against `burnrate report
--budgets`: the showback's fleet of known spend in a real Prometheus (tests/test_showback.py),
the window of tests/test_budgets_report.py (noon of the fleet's third day, in an ISO week that
began four days before it); the page's rows are the report's, in its callback and in Chromium."""
from __future__ import annotations

import json

import pytest
import yaml

from burnrate.analyzer.output.budget_report import rows
from burnrate.analyzer.sources.budgets_file import budgets
from burnrate.cli import main as burnrate
from burnrate.dashboard.budgets import install
from burnrate.dashboard.timerange import from_query, with_params
from burnrate.dashboard.ui import current_service
from tests.conftest import require
from tests.test_budgets_report import BUDGETS, END
from tests.test_dashboard_showback import app  # noqa: F401  (the page over the fleet's Prometheus, a fixture)
from tests.test_showback import START

SEARCH = with_params(f"?start={START!r}&end={END - 0.001!r}", period="week")


@pytest.fixture(scope="module")
def budgets_app(app):  # noqa: F811
    install(app.server, budgets(yaml.safe_load(BUDGETS)))
    return app


@pytest.fixture(scope="module")
def reported(store, tmp_path_factory):
    """`burnrate report --budgets --format json`'s block for the page's window."""
    import contextlib
    import io
    path = tmp_path_factory.mktemp("budgets") / "budgets.yaml"
    path.write_text(BUDGETS)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert burnrate(["report", "--prometheus", store, "--start", repr(START), "--end", repr(END - 0.001),
                         "--period", "week", "--format", "json", "--budgets", str(path)]) == 0
    return json.loads(out.getvalue())["budgets"]


def page_section(app, search: str) -> list:  # noqa: F811
    """The budgets section as the Cost page's callback draws it, once the page's analysis is done."""
    from burnrate.dashboard.pages import cost
    with app.server.app_context():
        service = current_service(search)
        service.analysis(from_query(search, service.default_range))     # as the page's first poll does
        section = cost.update_budgets(search, None)
    assert isinstance(section, list), section
    return section


def page_rows(app, search: str) -> list[list[str]]:  # noqa: F811
    table = next(p for p in page_section(app, search) if getattr(p, "id", None) == "cost-budgets-table")
    return [[cell.children for cell in row.children] for row in table.children[1].children]


@pytest.mark.slow
def test_the_budget_rows_are_the_reports(budgets_app, reported):
    assert [t["status"] for t in reported["teams"]] == ["over", "forecast_over", "within"]
    assert page_rows(budgets_app, SEARCH) == rows(reported)
    # the bars: each team's spend as a share of its own budget, beside the 100% line
    graph = next(p for p in page_section(budgets_app, SEARCH) if getattr(p, "id", None) == "cost-budgets-bars")
    bars = graph.figure.data[0]
    assert list(bars.y) == [t["team"] for t in reported["teams"]][::-1]
    assert list(bars.x) == [round(100 * t["spent_dollars"] / t["budget_dollars"], 2)
                            for t in reported["teams"]][::-1]
    assert graph.figure.layout.shapes[0].x0 == 100


@pytest.mark.slow
def test_the_browser_shows_the_reports_budget_rows(budgets_app, reported, tmp_path):
    pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.common.by import By
    from burnrate.dashboard.testing import chromium, screenshot, serve, table_rows, wait
    require("chromium"), require("chromedriver")
    with serve(budgets_app) as base, chromium(str(tmp_path / "profile")) as driver:
        driver.get(base + "/cost" + SEARCH)
        found = wait(driver, 90).until(
            lambda d: table_rows(d, "#cost-budgets-table tr.br-budget-row", ("data-team", "data-status")))
        assert [cells for cells, _ in found] == rows(reported)
        assert [tuple(attributes) for _, attributes in found] == \
            [(t["team"], t["status"]) for t in reported["teams"]]
        assert driver.find_elements(By.CSS_SELECTOR, "#cost-budgets-bars .js-plotly-plot")
        screenshot(driver, "cost-budgets")
        assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []


def test_without_a_budgets_file_the_section_says_how_to_get_one(tmp_path):
    from burnrate.analyzer.sources import RecordingSource
    from burnrate.dashboard.app import create_app
    from burnrate.dashboard.pages import cost
    from burnrate.simulator.simulate import Spec, simulate
    simulate(str(tmp_path / "rec"), Spec(nodes=1, gpus_per_node=2, hours=0.25, step_s=15.0, seed=0,
                                         end=1_795_000_000.0))
    plain = create_app(RecordingSource(str(tmp_path / "rec")), refresh_s=3600)
    with plain.server.app_context():
        assert cost.update_budgets("", None).children == ("Start the dashboard with --budgets FILE to see each "
                                                          "team's budget here (docs/budgets.md).")
        install(plain.server, budgets({"budgets": [{"namespace": "vision", "daily_dollars": 1}]}))
        section = cost.update_budgets("?by=label:team", None)
    assert section.children == ("Budgets: label:team reads kube-state-metrics' kube_pod_labels from Prometheus; "
                                "a recording does not carry pod labels: group by namespace")
