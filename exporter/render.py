"""The exposition, rendered on the first scrape after each snapshot and cached.

Snapshots come every second and Prometheus scrapes every 15-30 s, so rendering each
snapshot as it is taken (~1,000 series, a millisecond or two) would mostly render
text nobody reads. Scrapes that find the snapshot already rendered get the cached
bytes; gzip is made the same way, on the first scrape that asks for it.
"""
from __future__ import annotations

import gzip
import threading
from typing import Callable

from prometheus_client import CollectorRegistry

from .exposition import LabelTexts, encode

_NEVER = object()


class Exposition:
    """`version()` names what the registry would render now (the agent passes its latest
    snapshot): the text is rendered again only when that changes."""

    def __init__(self, registry: CollectorRegistry, version: Callable[[], object]) -> None:
        self._registry = registry
        self._version = version
        # One render at a time: concurrent scrapes of a new snapshot wait for the first one's.
        self._lock = threading.Lock()
        self._rendered: object = _NEVER
        self._plain = b""
        self._packed: bytes | None = None
        self._texts = LabelTexts()

    def plain(self) -> bytes:
        with self._lock:
            return self._current()

    def gzipped(self) -> bytes:
        with self._lock:
            body = self._current()
            if self._packed is None:
                self._packed = gzip.compress(body, compresslevel=5)
            return self._packed

    def _current(self) -> bytes:
        # The version is read before rendering: if a newer snapshot lands meanwhile, the
        # next scrape sees a version it has not rendered and renders again.
        version = self._version()
        if version is not self._rendered:
            self._plain, self._packed = encode(self._registry.collect(), self._texts), None
            self._rendered = version
        return self._plain
