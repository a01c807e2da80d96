"""The Findings page's filters, as they live in the URL's query string.

`?kind=straggler,idle_gpu&severity=critical&namespace=ml` keeps the findings of
those kinds, severities and namespaces; a filter left out keeps everything. Like
the time range, the filters are in the URL so that a filtered view can be shared
and comes back with the browser's back button.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping
from urllib.parse import parse_qs

from burnrate.analyzer.detectors.findings import KINDS, SEVERITIES, Finding

from .timerange import with_params

# A dropdown's values, in the URL: one parameter, values separated by commas
# (a repeated parameter is read too, as a hand-written URL may have it).
KIND, NAMESPACE, SEVERITY = "kind", "namespace", "severity"


@dataclass(frozen=True)
class FindingFilters:
    kinds: tuple[str, ...] = ()
    namespaces: tuple[str, ...] = ()
    severities: tuple[str, ...] = ()

    @classmethod
    def of(cls, kinds: Iterable[str] | None, namespaces: Iterable[str] | None,
           severities: Iterable[str] | None) -> FindingFilters:
        """Filters from the dropdowns' values (None when a dropdown is cleared). Kinds
        and severities the analyzer does not know are dropped: they would hide every row."""
        return cls(kinds=_unique(k for k in kinds or () if k in KINDS),
                   namespaces=_unique(namespaces or ()),
                   severities=_unique(s for s in severities or () if s in SEVERITIES))

    @classmethod
    def from_params(cls, params: Mapping[str, str | list[str]]) -> FindingFilters:
        """Filters from parsed query parameters, single (`str`) or repeated (`list`)."""
        return cls.of(_split(params.get(KIND)), _split(params.get(NAMESPACE)), _split(params.get(SEVERITY)))

    @classmethod
    def from_query(cls, search: str | None) -> FindingFilters:
        return cls.from_params(parse_qs((search or "").lstrip("?")))

    def in_query(self, search: str | None) -> str:
        """`search` with these filters in place of the ones it had; every other parameter kept."""
        return with_params(search, **{KIND: ",".join(self.kinds) or None,
                                      NAMESPACE: ",".join(self.namespaces) or None,
                                      SEVERITY: ",".join(self.severities) or None})

    def keeps(self, finding: Finding) -> bool:
        return ((not self.kinds or finding.kind in self.kinds)
                and (not self.namespaces or finding.namespace in self.namespaces)
                and (not self.severities or finding.severity in self.severities))


def _split(value: str | list[str] | None) -> list[str]:
    parts = [value] if isinstance(value, str) else value or []
    return [v.strip() for part in parts for v in part.split(",") if v.strip()]


def _unique(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(values))
