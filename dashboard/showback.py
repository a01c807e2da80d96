"""The Cost page's showback: each team's figures per calendar period of the page's range,
worked out as `burnrate report` works them out (docs/showback.md), from one analysis per period.

The grouping and the period live in the URL (`?by=label:team&period=week`), as the page's
other selections do, so a shared link opens the same table.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from burnrate.analyzer.grid.frames import Window
from burnrate.analyzer.output.showback import NAMESPACE, PERIODS, add_changes, periods
from burnrate.analyzer.output.showback_command import NO_SAMPLES, label_key, period_figures, unlabelled_note
from burnrate.analyzer.output.showback_render import to_document
from burnrate.analyzer.sources import PrometheusError, PrometheusSource
from burnrate.exporter.errors import UserError

from .data import PERIOD_ANALYSES, Analysis, DataService
from .timerange import query, with_params

BY, PERIOD = "by", "period"
# The page's ranges run from an hour to a week: a day is the period they hold whole.
DEFAULT_PERIOD = "day"


class ShowbackError(ValueError):
    """A grouping or period the page cannot show; the message is one line it shows instead."""


@dataclass(frozen=True)
class Choice:
    by: str = NAMESPACE
    period: str = DEFAULT_PERIOD

    @classmethod
    def of(cls, by: str | None, period: str | None) -> Choice:
        return cls((by or "").strip() or NAMESPACE, period or DEFAULT_PERIOD)

    @classmethod
    def from_query(cls, search: str | None) -> Choice:
        params = query(search)
        return cls.of(params.get(BY), params.get(PERIOD))

    def in_query(self, search: str | None) -> str:
        """`search` with this choice in place of the one it had; a default leaves its parameter out."""
        return with_params(search, **{BY: None if self.by == NAMESPACE else self.by,
                                      PERIOD: None if self.period == DEFAULT_PERIOD else self.period})


def team_key(service: DataService, choice: Choice) -> str | None:
    """The pods' label that names the teams of `choice` (None: by namespace), once the page can show it."""
    if choice.period not in PERIODS:
        raise ShowbackError(f"period= wants {', '.join(PERIODS)}, not {choice.period!r}")
    try:
        key = label_key(choice.by)
    except UserError:
        raise ShowbackError(f"teams are by namespace or label:KEY (e.g. label:team), not {choice.by!r}") from None
    if key is not None and not isinstance(service.source, PrometheusSource):
        raise ShowbackError(f"{choice.by} reads kube-state-metrics' kube_pod_labels from Prometheus; a recording "
                            "does not carry pod labels: group by namespace")
    return key


def period_analysis(service: DataService, analysis: Analysis, window: Window, key: str | None,
                    choice: Choice) -> Analysis:
    """The analysis of one period: the range's own where the period is the range and it was
    read as the grouping needs, else the period's from the service's cache. Teams by a pod
    label (`key`) need every pod's GPU-hours: per GPU, never from the roll-ups (as
    `burnrate report --by label:KEY` reads them)."""
    if window == analysis.frames.window and (key is None or analysis.overview is None):
        return analysis
    return service.period_analysis(window, None if key is None else f"--by {choice.by}")


def showback(service: DataService, analysis: Analysis, choice: Choice, now: float) -> dict[str, Any]:
    """`burnrate report`'s document (docs/showback.md) for the periods of the analysis' window.
    A period that is the whole window reuses its analysis; each other one is analysed once, in
    the service's cache."""
    key = team_key(service, choice)
    spans = periods(analysis.frames.window, choice.period, now)
    if len(spans) > PERIOD_ANALYSES:
        raise ShowbackError(f"the range holds {len(spans)} {choice.period}s, more than the {PERIOD_ANALYSES} "
                            "showback analyses: pick a longer period or a shorter range")
    figures, labelled = [], 0
    for span in spans:
        a = period_analysis(service, analysis, span.window, key, choice)
        report = None if a.frames.gpu.empty else a.report
        try:
            figure, labels = period_figures(span, report, list(report.notes) if report else [NO_SAMPLES],
                                            service.source, key)
        except (PrometheusError, OSError, ValueError) as exc:
            raise ShowbackError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
        labelled += labels
        figures.append(figure)
    add_changes(figures)
    return to_document(choice.by, choice.period, figures,
                       [unlabelled_note(key)] if key is not None and not labelled else [])
