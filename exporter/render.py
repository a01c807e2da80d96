"""Render the exposition once per snapshot and keep the bytes.

Scrapes then serve cached bytes: rendering ~1,000 series takes a couple of
milliseconds, which would otherwise land on every scrape's latency. Gzip waits for
the first scrape that asks for it: snapshots come every second, scrapes every 15-30 s.
"""
from __future__ import annotations

import gzip
import threading

from prometheus_client import CollectorRegistry

from .exposition import encode


class Exposition:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self._lock = threading.Lock()
        self._plain = b""
        self._packed: bytes | None = None

    def refresh(self) -> bytes:
        body = encode(self._registry.collect())
        with self._lock:
            self._plain, self._packed = body, None
        return body

    def plain(self) -> bytes:
        with self._lock:
            return self._plain

    def gzipped(self) -> bytes:
        """The latest render, gzipped once however many scrapes ask (the lock makes
        concurrent ones wait for that one compression)."""
        with self._lock:
            if self._packed is None:
                self._packed = gzip.compress(self._plain, compresslevel=5)
            return self._packed
