"""Render the exposition once per snapshot and keep the bytes.

Scrapes then serve cached bytes (gzip too): rendering ~1,000 series takes
milliseconds, which would otherwise land on every scrape's latency.
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
        self._bodies: tuple[bytes, bytes] = (b"", gzip.compress(b""))

    def refresh(self) -> bytes:
        body = encode(self._registry.collect())
        packed = gzip.compress(body, compresslevel=5)
        with self._lock:
            self._bodies = (body, packed)
        return body

    def bodies(self) -> tuple[bytes, bytes]:
        """(plain, gzip) of the same render, swapped together."""
        with self._lock:
            return self._bodies
