"""Teams by a pod label (`--by label:KEY`, docs/showback.md): the value of the pods' Kubernetes
label KEY, from kube-state-metrics' kube_pod_labels."""
from __future__ import annotations

import re

from burnrate.exporter.errors import UserError

from ..grid.frames import Window
from .showback import NAMESPACE

LABEL = "label:"


def label_key(by: str) -> str | None:
    """The kube-state-metrics label (`label_<KEY>`, KEY sanitized as kube-state-metrics does) of
    `--by label:KEY`, or None for `--by namespace`."""
    if by == NAMESPACE:
        return None
    if not by.startswith(LABEL) or not by[len(LABEL):]:
        raise UserError(f"--by wants namespace or label:KEY (e.g. label:team), not {by!r}")
    return "label_" + re.sub(r"[^a-zA-Z0-9_]", "_", by[len(LABEL):])


def pod_labels(source, key: str, period: Window) -> dict[tuple[str, str], str]:
    """(namespace, pod) -> the pod's label value, from kube_pod_labels over the period."""
    scope = "".join(f',{k}=~"{re.escape(v)}|"' for k, v in getattr(source, "scope", {}).items())
    seconds = max(int(period.end - period.start), 1)
    promql = f'max by (namespace, pod, {key}) (last_over_time(kube_pod_labels{{{key}!=""{scope}}}[{seconds}s]))'
    return {(r["metric"].get("namespace", ""), r["metric"].get("pod", "")): r["metric"][key]
            for r in source.query(promql, period.end)}
