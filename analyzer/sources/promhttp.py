"""One exchange with a Prometheus-compatible HTTP API, with nothing a hostile or broken
server can turn against the analyzer:

- no redirect is followed: urllib would send the credentials to wherever it points,
  and the user is told the URL to give instead;
- the timeout is a deadline on the wall clock for the whole exchange (connecting, the
  status line, the headers, the body): when it comes, the socket is shut, so a server
  that drips a byte a second cannot hold the analysis for ever;
- an answer over `max_bytes` is refused before it is all in memory, and so is one whose
  series or points pass the `Limits` of its read (counted as the bytes arrive, Tally);
- an answer that is not Prometheus's (not JSON, nested past what the decoder takes,
  not `status: success` with a `data` mapping) is an error, never an empty report.

A range query's answer is most of what a large analysis reads: msgspec reads each series'
numbers as one flat list into floats (`matrix`), several times quicker than JSON's lists of
strings converted after. Each
thread keeps its connection open between exchanges (http.client, with the same rules:
nothing followed, the same deadline and limit), and opens it anew once where the server
had closed it; a URL the environment sends through a proxy goes urllib's way.
"""
from __future__ import annotations

import contextlib
import functools
import heapq
import http.client
import itertools
import json
import os
import re
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Literal, Mapping

import msgspec
import numpy as np

MAX_ANSWER_BYTES = 256 << 20      # a 1,000-point chunk of a thousand GPUs is ~30 MB
# Answers other than a range query's (instant queries, targets, rules) are decoded by Python's
# json into an object per value: about twenty times their size at worst, so they get less room.
MAX_DATA_BYTES = 32 << 20
READ_BYTES = 1 << 16
# What one read may hold (docs/sources.md): a series costs ~1 KB held, a point 16 bytes,
# so a read at both limits stays near 2.6 GB, within the analyzer Deployment's 4 GiB.
MAX_SERIES = 1_000_000
MAX_POINTS = 100_000_000
# While one answer is decoded its text, each series' part of it and their floats are all held:
# no answer may hold more than this (a real one of 256 MiB holds ~9 million).
ANSWER_POINTS = 10_000_000
_METRIC_NAME = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{")


@dataclass(frozen=True)
class Limits:
    """The most series and points the answers of one read may hold."""
    series: int = MAX_SERIES
    points: int = MAX_POINTS


class _Passed(Exception):
    def __init__(self, what: str, limit: int) -> None:
        super().__init__(what)
        self.what, self.limit = what, limit


class Tally:
    """The series and points of a read's answers so far, counted as their bytes arrive and
    shared by the answers it waits for at once, so that reading stops as soon as a limit is
    passed, before the answer is decoded. JSON opens every series and its labels with `{`
    and every point with `[`: counting those bytes gives at least the true numbers (a brace
    in a label value counts too), and no spelling of the answer can hide one."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.braces = self.points = 0
        self._lock = threading.Lock()

    def take(self, part: bytes) -> int:
        """Counts `part`; its points (brackets), for the answer's own count."""
        points = part.count(b"[")
        with self._lock:
            self.braces += part.count(b"{")
            self.points += points
            self.check()
        return points

    def check(self) -> None:
        if self.braces // 2 > self.limits.series:
            raise _Passed("series", self.limits.series)
        if self.points > self.limits.points:
            raise _Passed("points", self.limits.points)


class _Series(msgspec.Struct):
    metric: dict[str, str]
    values: msgspec.Raw     # its JSON checked here, its numbers read by _points


class _Matrix(msgspec.Struct):
    resultType: Literal["matrix"]
    result: list[_Series]


class _Success(msgspec.Struct):
    status: Literal["success"]
    data: _Matrix


# An answer of another shape takes the generic way, which also names what went wrong.
_MATRIX = msgspec.json.Decoder(_Success)
_FLAT = msgspec.json.Decoder(list[float])
# strict=False reads quoted values as floats: Prometheus spells NaN and ±Inf so ("+Inf" once as "Inf").
_PAIRS = msgspec.json.Decoder(list[tuple[float, float]], strict=False)


def _pairs(values: list) -> np.ndarray:
    """JSON's reading of a series' values as (n, 2) floats; a ValueError where they are not pairs."""
    array = np.asarray(values, dtype=object)
    if array.size and (array.ndim != 2 or array.shape[1] != 2):
        raise ValueError("not pairs of a time and a value")
    return array.reshape(-1, 2).astype(np.float64)


def _points(values: bytes) -> np.ndarray:
    """A series' `[[time, "value"], ...]` as an (n, 2) float array. With its numbers' characters
    dropped, n pairs of a number and a quoted number leave exactly `[[,""],[,""],...]` (one
    pass, half the cost of counting its brackets and quotes); where they do, its brackets and
    quotes dropped, the numbers are one flat JSON list, read with no object per pair (twice as
    quick). Anything else (NaN, ±Inf, a wrong shape) is read and checked pair by pair."""
    shape = values.translate(None, _NUMBER_BYTES)
    n, rest = divmod(len(shape) - 1, len(_PAIR))
    if n and not rest and shape == _pairs_shape(n):
        try:
            flat = _FLAT.decode(b"[" + values.translate(None, b'[]"') + b"]")
        except (msgspec.ValidationError, msgspec.DecodeError):
            flat = []
        if len(flat) == 2 * n:
            return np.array(flat, np.float64).reshape(-1, 2)
    return np.array(_PAIRS.decode(values.replace(b'"+Inf"', b'"Inf"')), np.float64).reshape(-1, 2)


# What a number may be spelt with in JSON, and what a pair leaves without them.
_NUMBER_BYTES = b"0123456789.eE+-"
_PAIR = b'[,""],'


@functools.lru_cache(maxsize=64)
def _pairs_shape(n: int) -> bytes:
    return b"[" + _PAIR * (n - 1) + _PAIR[:-1] + b"]"


class PrometheusError(RuntimeError):
    """Prometheus unreachable, too slow, or answering an error: one line for the user."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise _redirected(req.full_url, code, newurl)


def _redirected(url: str, code: int, to: str) -> PrometheusError:
    return PrometheusError(f"Prometheus at {_base(url)} redirected (HTTP {code}) to {urllib.parse.urljoin(url, to)}; "
                           "credentials are not sent on: give that URL instead")


def _base(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


class _Stale(Exception):
    """A kept connection the server had closed."""


class _Deadline:
    """The end of one exchange on the wall clock. A socket's timeout bounds each read, and a
    server sending a byte a second never trips it: at the deadline the watchdog shuts the socket
    of every connection the exchange `watch`es, which ends whatever read is waiting on it."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds
        self.passed = False
        self.over = False
        self._watched: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def __enter__(self) -> "_Deadline":
        _WATCHDOG.watch(self)
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self.over = True
            self._watched.clear()   # a kept connection outlives its exchange: not this deadline's to shut

    def left(self) -> float:
        return max(self.end - time.monotonic(), 1e-3)

    def watch(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._watched.append(conn)
            if self.passed:
                _shut(conn)

    def cut(self) -> None:
        with self._lock:
            if self.over:
                return
            self.passed = True
            for conn in self._watched:
                _shut(conn)


class _Watchdog:
    """One thread for every exchange's deadline. A timer thread started per exchange waited
    for the GIL twice while the other readers decoded answers (msgspec holds it for a whole
    answer): 270 ms a start with three decoding, where the exchange itself takes a few."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)   # a forked child has no watchdog thread

    def _reset(self) -> None:
        self._due: list[tuple[float, int, _Deadline]] = []
        self._order = itertools.count()
        self._changed = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None

    def watch(self, deadline: _Deadline) -> None:
        with self._changed:
            heapq.heappush(self._due, (deadline.end, next(self._order), deadline))
            if self._thread is None or not self._thread.is_alive():   # none yet, or ended with an error
                self._thread = threading.Thread(target=self._run, name="prometheus-deadlines", daemon=True)
                self._thread.start()
            elif self._due[0][2] is deadline:
                self._changed.notify()

    def _run(self) -> None:
        with self._changed:
            while True:
                while self._due and self._due[0][2].over:
                    heapq.heappop(self._due)
                wait = self._due[0][0] - time.monotonic() if self._due else None
                if wait is None or wait > 0:
                    self._changed.wait(wait)
                    continue
                heapq.heappop(self._due)[2].cut()


_WATCHDOG = _Watchdog()


def _shut(conn: http.client.HTTPConnection) -> None:
    if conn.sock is not None:
        with contextlib.suppress(OSError):
            conn.sock.shutdown(socket.SHUT_RDWR)


class _Watched:
    """A connection that its exchange's deadline shuts; kept open between a thread's
    exchanges, and closed when the thread lets it go."""
    reused = False
    deadline: _Deadline

    def connect(self) -> None:
        # Watched before connecting: a deadline that comes during the TLS handshake shuts it.
        self.timeout = self.deadline.left()
        self.deadline.watch(self)
        super().connect()
        if self.deadline.passed:        # it came while the socket was being made
            raise TimeoutError()

    def __del__(self) -> None:
        self.close()


class _WatchedHTTP(_Watched, http.client.HTTPConnection):
    pass


class _WatchedTLS(_Watched, http.client.HTTPSConnection):
    pass


def _watched(kind: type, deadline: _Deadline):
    """urllib's connection class for one exchange: `kind`, watched by its deadline."""
    def connection(*args, **kwargs) -> http.client.HTTPConnection:
        conn = kind(*args, **kwargs)
        conn.deadline = deadline
        return conn
    return connection


class _WatchedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def http_open(self, req):
        return self.do_open(_watched(_WatchedHTTP, self.deadline), req)


class _WatchedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline, context: ssl.SSLContext | None) -> None:
        super().__init__(context=context)
        self.deadline = deadline

    def https_open(self, req):
        return self.do_open(_watched(_WatchedTLS, self.deadline), req, context=self._context)


class PrometheusHTTP:
    def __init__(self, url: str, headers: Mapping[str, str], timeout_s: float,
                 context: ssl.SSLContext | None = None, max_bytes: int = MAX_ANSWER_BYTES,
                 limits: Limits = Limits()) -> None:
        self.url, self.headers, self.timeout_s, self.max_bytes = url, dict(headers), timeout_s, max_bytes
        self.limits = limits
        self._context = context
        # A fleet's drill-down is hundreds of range queries: each thread keeps its connection
        # open (urllib opens one per request, about 2 ms of CPU each). Where the environment's
        # proxy settings send this URL through a proxy, urllib's way is kept, as it honours them.
        parts = urllib.parse.urlsplit(url)
        proxies = urllib.request.getproxies()
        self._direct = parts.scheme in ("http", "https") and not (
            parts.scheme in proxies and not urllib.request.proxy_bypass(parts.hostname or ""))
        self._kept = threading.local()

    def tally(self) -> Tally:
        """A count against this store's limits, for the answers of one read."""
        return Tally(self.limits)

    def data(self, path: str, params: Mapping[str, str], post: bool = True) -> dict:
        """`data` of a successful answer to GET or POST `path`; PrometheusError otherwise."""
        return self._decode(self._exchange(path, params, post, self.tally(), min(self.max_bytes, MAX_DATA_BYTES)))

    def matrix(self, path: str, params: Mapping[str, str], tally: Tally | None = None) -> list[dict]:
        """The series of a range query's answer (POST), each `{"metric": labels, "values":
        (n, 2) float array of times and values}`; PrometheusError otherwise. `tally` counts
        this answer with the others of its read (by default, on its own)."""
        raw = self._exchange(path, params, True, tally or self.tally(), self.max_bytes)
        try:
            return [{"metric": s.metric, "values": _points(bytes(s.values))} for s in _MATRIX.decode(raw).data.result]
        except (msgspec.ValidationError, msgspec.DecodeError):
            pass
        if len(raw) > MAX_DATA_BYTES:   # too large for Python's json, only to say what is wrong with it
            raise PrometheusError(f"Prometheus at {self.url} answered a matrix that is not Prometheus's")
        data = self._decode(raw)
        if data.get("resultType") != "matrix":
            raise PrometheusError(f"Prometheus at {self.url} answered a {data.get('resultType')}, not a matrix")
        try:
            return [{"metric": dict(s["metric"]), "values": _pairs(s["values"])} for s in data["result"]]
        except (KeyError, TypeError, ValueError):
            raise PrometheusError(f"Prometheus at {self.url} answered a matrix that is not Prometheus's") from None

    def _request(self, path: str, params: Mapping[str, str], post: bool) -> urllib.request.Request:
        query = urllib.parse.urlencode(params)
        if post:
            return urllib.request.Request(self.url + path, data=query.encode(), headers={
                **self.headers, "Content-Type": "application/x-www-form-urlencoded"})
        return urllib.request.Request(f"{self.url}{path}?{query}", headers=self.headers)

    def _decode(self, raw: bytes) -> dict:
        where = f"Prometheus at {self.url}"
        try:
            answer = json.loads(raw)
        except (ValueError, RecursionError):
            raise PrometheusError(f"{where} answered something that is not JSON: not a Prometheus API") from None
        if not isinstance(answer, dict) or answer.get("status") != "success":
            raise PrometheusError(f"{where} answered an error: {api_error(raw) or 'no status'}")
        if not isinstance(answer.get("data"), dict):
            raise PrometheusError(f"{where} answered success without data: not a Prometheus API")
        return answer["data"]

    def _exchange(self, path: str, params: Mapping[str, str], post: bool, tally: Tally, max_bytes: int) -> bytes:
        request = self._request(path, params, post)
        with _Deadline(self.timeout_s) as deadline:
            try:
                tally.check()   # another answer of the read passed a limit: ask nothing more
                raw = (self._kept_exchange if self._direct else self._urllib_exchange)(request, deadline, tally,
                                                                                       max_bytes)
            except _Passed as passed:
                raise self._too_many(passed, params) from None
            except (OSError, http.client.HTTPException) as exc:
                if deadline.passed or isinstance(exc, TimeoutError):
                    raise self._late() from None
                if isinstance(exc, OSError):
                    raise self._unreachable(exc) from None
                raise PrometheusError(f"Prometheus at {self.url} answered something that is not HTTP "
                                      f"({type(exc).__name__})") from None
            except PrometheusError:
                if deadline.passed:
                    raise self._late() from None
                raise
            if deadline.passed:     # shut at the deadline, the answer can look whole and be cut short
                raise self._late()
            return raw

    def _kept_exchange(self, request: urllib.request.Request, deadline: _Deadline, tally: Tally,
                       max_bytes: int) -> bytes:
        conn = self._connection(deadline, fresh=False)
        try:
            resp = self._send(conn, request)
        except _Stale:      # the server closed a kept connection while it was idle: once more, anew
            conn = self._connection(deadline, fresh=True)
            resp = self._send(conn, request)
        try:
            return self._body(resp, request.full_url, deadline, tally, max_bytes)
        finally:
            if resp.will_close or not (resp.isclosed() or resp.length == 0):   # or an answer not read to its end
                conn.close()
            else:
                resp.close()    # read to its end: the connection takes the next request

    def _send(self, conn: http.client.HTTPConnection, request: urllib.request.Request) -> http.client.HTTPResponse:
        target = urllib.parse.urlsplit(request.full_url)
        try:
            conn.request(request.get_method(), target.path + (f"?{target.query}" if target.query else ""),
                         body=request.data, headers=dict(request.header_items()))
            return conn.getresponse()
        except OSError as exc:
            conn.close()
            if (conn.reused and not conn.deadline.passed
                    and isinstance(exc, (ConnectionResetError, BrokenPipeError))):   # RemoteDisconnected too
                raise _Stale() from None
            raise

    def _connection(self, deadline: _Deadline, fresh: bool) -> http.client.HTTPConnection:
        conn = getattr(self._kept, "conn", None)
        if conn is None or fresh:
            parts = urllib.parse.urlsplit(self.url)
            conn = (_WatchedTLS(parts.hostname, parts.port, timeout=self.timeout_s, context=self._context)
                    if parts.scheme == "https" else _WatchedHTTP(parts.hostname, parts.port, timeout=self.timeout_s))
            self._kept.conn = conn
        else:
            conn.reused = True
        conn.deadline = deadline
        deadline.watch(conn)
        return conn

    def _body(self, resp: http.client.HTTPResponse, url: str, deadline: _Deadline, tally: Tally,
              max_bytes: int) -> bytes:
        if resp.status in (301, 302, 303, 307, 308) and resp.getheader("Location"):
            raise _redirected(url, resp.status, resp.getheader("Location"))
        if not 200 <= resp.status < 300:
            raise self._refused(resp.status, resp.read(READ_BYTES), resp.reason)
        return self._read(resp, deadline, tally, max_bytes)

    def _late(self) -> PrometheusError:
        return PrometheusError(f"Prometheus at {self.url} did not answer within {self.timeout_s:g} s")

    def _refused(self, code: int, raw: bytes, reason: str) -> PrometheusError:
        why = api_error(raw) or reason
        if code == 401:
            why += (" (the credentials given were refused)" if "Authorization" in self.headers else
                    " (it asks for credentials: a bearer token or basic auth, docs/sources.md)")
        if code == 404:
            why += " (a Prometheus API answers under URL/api/v1/: give the server's base URL)"
        return PrometheusError(f"Prometheus at {self.url} answered HTTP {code}: {why}")

    def _unreachable(self, exc: OSError) -> PrometheusError:
        if isinstance(exc, ssl.SSLError) and exc.reason == "WRONG_VERSION_NUMBER":    # a plain HTTP answer to TLS
            plain = "http:" + self.url.split(":", 1)[1]
            return PrometheusError(f"Prometheus at {self.url} speaks plain HTTP, not TLS: use {plain}")
        hint = " (name the CA that signed it with --ca-file)" if isinstance(exc, ssl.SSLCertVerificationError) else ""
        return PrometheusError(f"cannot reach Prometheus at {self.url}: {exc.strerror or exc}{hint}")

    def _urllib_exchange(self, request: urllib.request.Request, deadline: _Deadline, tally: Tally,
                         max_bytes: int) -> bytes:
        """The exchange urllib makes, where the environment's proxy settings send the URL."""
        opener = urllib.request.build_opener(_NoRedirect(), _WatchedHTTPHandler(deadline),
                                             _WatchedHTTPSHandler(deadline, self._context))
        try:
            with opener.open(request, timeout=self.timeout_s) as resp:
                return self._read(resp, deadline, tally, max_bytes)
        except urllib.error.HTTPError as exc:
            raise self._refused(exc.code, exc.read(READ_BYTES), exc.reason) from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, OSError):
                raise exc.reason from None
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: {exc.reason}") from None

    def _read(self, resp, deadline: _Deadline, tally: Tally, max_bytes: int) -> bytes:
        declared = resp.headers.get("Content-Length")
        if declared and declared.isdigit() and int(declared) > max_bytes:
            raise self._too_big(max_bytes)
        parts, size, points = [], 0, 0
        while True:
            if deadline.passed:
                raise self._late()
            part = resp.read1(READ_BYTES)
            if not part:
                return b"".join(parts)
            size += len(part)
            if size > max_bytes:
                raise self._too_big(max_bytes)
            points += tally.take(part)
            if points > ANSWER_POINTS:
                raise PrometheusError(f"Prometheus at {self.url} answered more than {ANSWER_POINTS:,} points in one "
                                      "answer; a shorter window or a narrower selection asks for less")
            parts.append(part)

    def _too_many(self, passed: _Passed, params: Mapping[str, str]) -> PrometheusError:
        asked = sorted(set(_METRIC_NAME.findall(params.get("query", ""))))
        what = f" reading {', '.join(asked)}" if asked else ""
        return PrometheusError(f"Prometheus at {self.url} answered more than {passed.limit:,} {passed.what} "
                               f"(--max-{passed.what}){what}: stopped there; a shorter window, one --cluster or "
                               "--fleet asks for less")

    def _too_big(self, max_bytes: int) -> PrometheusError:
        return PrometheusError(f"Prometheus at {self.url} answered more than {max_bytes >> 20} MiB; "
                               "a shorter window or a narrower selection asks for less")


def api_error(raw: bytes) -> str:
    try:
        answer = json.loads(raw)
    except (ValueError, RecursionError):
        text = raw.decode("utf-8", "replace").strip().splitlines()
        return text[0][:200] if text else ""
    if isinstance(answer, dict) and answer.get("error"):
        return f"{answer.get('errorType', 'error')}: {answer['error']}".splitlines()[0]
    return ""
