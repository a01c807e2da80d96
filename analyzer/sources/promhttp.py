"""One exchange with a Prometheus-compatible HTTP API, with nothing a hostile or broken
server can turn against the analyzer:

- no redirect is followed: urllib would send the credentials to wherever it points,
  and the user is told the URL to give instead;
- the timeout is a deadline for the whole answer, not for each read, so a server that
  drips a byte every few seconds cannot hold the analysis for ever;
- an answer over `max_bytes` is refused before it is all in memory;
- an answer that is not Prometheus's (not JSON, nested past what the decoder takes,
  not `status: success` with a `data` mapping) is an error, never an empty report.

A range query's answer is most of what a large analysis reads: it is decoded straight into
floats (`matrix`), several times quicker than JSON's lists of strings converted after. Each
thread keeps its connection open between exchanges (http.client, with the same rules:
nothing followed, the same deadline and limit), and opens it anew once where the server
had closed it; a URL the environment sends through a proxy goes urllib's way.
"""
from __future__ import annotations

import contextlib
import gc
import http.client
import itertools
import json
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Literal, Mapping

import msgspec
import numpy as np

MAX_ANSWER_BYTES = 256 << 20      # a 1,000-point chunk of a thousand GPUs is ~30 MB
READ_BYTES = 1 << 16


class _Series(msgspec.Struct):
    metric: dict[str, str]
    values: list[tuple[float, float]]


class _Matrix(msgspec.Struct):
    resultType: Literal["matrix"]
    result: list[_Series]


class _Success(msgspec.Struct):
    status: Literal["success"]
    data: _Matrix


# strict=False reads Prometheus' quoted sample values as floats; an answer with one it cannot
# ("+Inf") or of another shape takes the generic way, which also names what went wrong.
_MATRIX = msgspec.json.Decoder(_Success, strict=False)


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector held off while range answers are decoded and put
    together: their points are millions of tuples, freed by reference counting, that set it
    off thousands of times (half a second of a week's drill-down). Left as it was found."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


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


class _Kept:
    """A connection kept open between exchanges, closed when its thread lets it go."""
    reused = False

    def __del__(self) -> None:
        self.close()


class _KeptHTTP(_Kept, http.client.HTTPConnection):
    pass


class _KeptTLS(_Kept, http.client.HTTPSConnection):
    pass


class PrometheusHTTP:
    def __init__(self, url: str, headers: Mapping[str, str], timeout_s: float,
                 context: ssl.SSLContext | None = None, max_bytes: int = MAX_ANSWER_BYTES) -> None:
        self.url, self.headers, self.timeout_s, self.max_bytes = url, dict(headers), timeout_s, max_bytes
        handlers: list = [_NoRedirect()]
        if context is not None:
            handlers.append(urllib.request.HTTPSHandler(context=context))
        self._opener = urllib.request.build_opener(*handlers)
        self._context = context
        # A fleet's drill-down is hundreds of range queries: each thread keeps its connection
        # open (urllib opens one per request, about 2 ms of CPU each). Where the environment's
        # proxy settings send this URL through a proxy, urllib's way is kept, as it honours them.
        parts = urllib.parse.urlsplit(url)
        proxies = urllib.request.getproxies()
        self._direct = parts.scheme in ("http", "https") and not (
            parts.scheme in proxies and not urllib.request.proxy_bypass(parts.hostname or ""))
        self._kept = threading.local()

    def data(self, path: str, params: Mapping[str, str], post: bool = True) -> dict:
        """`data` of a successful answer to GET or POST `path`; PrometheusError otherwise."""
        return self._decode(self._exchange(path, params, post))

    def matrix(self, path: str, params: Mapping[str, str]) -> list[dict]:
        """The series of a range query's answer (POST), each `{"metric": labels, "values":
        (n, 2) float array of times and values}`; PrometheusError otherwise."""
        raw = self._exchange(path, params, post=True)
        try:
            # fromiter over the flattened pairs: twice as quick as np.array's look at each pair.
            return [{"metric": s.metric, "values": np.fromiter(itertools.chain.from_iterable(s.values), np.float64,
                                                               2 * len(s.values)).reshape(-1, 2)}
                    for s in _MATRIX.decode(raw).data.result]
        except (msgspec.ValidationError, msgspec.DecodeError):
            pass
        data = self._decode(raw)
        if data.get("resultType") != "matrix":
            raise PrometheusError(f"Prometheus at {self.url} answered a {data.get('resultType')}, not a matrix")
        try:
            return [{"metric": dict(s["metric"]), "values": np.asarray(s["values"], dtype=object)
                     .reshape(-1, 2).astype(np.float64)} for s in data["result"]]
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

    def _exchange(self, path: str, params: Mapping[str, str], post: bool) -> bytes:
        if not self._direct:
            return self._answer(self._request(path, params, post))
        late = self._late()
        deadline = time.monotonic() + self.timeout_s
        request = self._request(path, params, post)
        conn = self._connection(fresh=False)
        try:
            resp = self._send(conn, request, late)
        except _Stale:      # the server closed a kept connection while it was idle: once more, anew
            conn = self._connection(fresh=True)
            resp = self._send(conn, request, late)
        try:
            return self._body(resp, request.full_url, deadline, late)
        finally:
            if resp.will_close or not (resp.isclosed() or resp.length == 0):   # or an answer not read to its end
                conn.close()
            else:
                resp.close()    # read to its end: the connection takes the next request

    def _send(self, conn: http.client.HTTPConnection, request: urllib.request.Request,
              late: PrometheusError) -> http.client.HTTPResponse:
        target = urllib.parse.urlsplit(request.full_url)
        try:
            conn.request(request.get_method(), target.path + (f"?{target.query}" if target.query else ""),
                         body=request.data, headers=dict(request.header_items()))
            return conn.getresponse()
        except OSError as exc:
            conn.close()
            if conn.reused and isinstance(exc, (ConnectionResetError, BrokenPipeError)):   # RemoteDisconnected too
                raise _Stale() from None
            raise late if isinstance(exc, TimeoutError) else self._unreachable(exc) from None

    def _connection(self, fresh: bool) -> http.client.HTTPConnection:
        conn = getattr(self._kept, "conn", None)
        if conn is None or fresh:
            parts = urllib.parse.urlsplit(self.url)
            conn = (_KeptTLS(parts.hostname, parts.port, timeout=self.timeout_s, context=self._context)
                    if parts.scheme == "https" else _KeptHTTP(parts.hostname, parts.port, timeout=self.timeout_s))
            self._kept.conn = conn
        else:
            conn.reused = True
        return conn

    def _body(self, resp: http.client.HTTPResponse, url: str, deadline: float, late: PrometheusError) -> bytes:
        try:
            if resp.status in (301, 302, 303, 307, 308) and resp.getheader("Location"):
                raise _redirected(url, resp.status, resp.getheader("Location"))
            if not 200 <= resp.status < 300:
                raise self._refused(resp.status, resp.read(READ_BYTES), resp.reason)
            return self._read(resp, deadline, late)
        except OSError as exc:
            raise late if isinstance(exc, TimeoutError) else self._unreachable(exc) from None

    def _late(self) -> PrometheusError:
        return PrometheusError(f"Prometheus at {self.url} did not answer within {self.timeout_s:g} s")

    def _refused(self, code: int, raw: bytes, reason: str) -> PrometheusError:
        why = api_error(raw) or reason
        if code == 401:
            why += (" (the credentials given were refused)" if "Authorization" in self.headers else
                    " (it asks for credentials: a bearer token or basic auth, docs/sources.md)")
        return PrometheusError(f"Prometheus at {self.url} answered HTTP {code}: {why}")

    def _unreachable(self, exc: OSError) -> PrometheusError:
        hint = " (name the CA that signed it with --ca-file)" if isinstance(exc, ssl.SSLCertVerificationError) else ""
        return PrometheusError(f"cannot reach Prometheus at {self.url}: {exc.strerror or exc}{hint}")

    def _answer(self, request: urllib.request.Request) -> bytes:
        late = self._late()
        deadline = time.monotonic() + self.timeout_s
        try:
            with self._opener.open(request, timeout=self.timeout_s) as resp:
                return self._read(resp, deadline, late)
        except urllib.error.HTTPError as exc:
            raise self._refused(exc.code, exc.read(READ_BYTES), exc.reason) from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, TimeoutError):
                raise late from None
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: "
                                  f"{getattr(reason, 'strerror', None) or reason}") from None
        except OSError as exc:
            raise late if isinstance(exc, TimeoutError) else self._unreachable(exc) from None

    def _read(self, resp, deadline: float, late: PrometheusError) -> bytes:
        declared = resp.headers.get("Content-Length")
        if declared and declared.isdigit() and int(declared) > self.max_bytes:
            raise self._too_big()
        parts, size = [], 0
        while True:
            if time.monotonic() > deadline:
                raise late
            part = resp.read1(READ_BYTES)
            if not part:
                return b"".join(parts)
            size += len(part)
            if size > self.max_bytes:
                raise self._too_big()
            parts.append(part)

    def _too_big(self) -> PrometheusError:
        return PrometheusError(f"Prometheus at {self.url} answered more than {self.max_bytes >> 20} MiB; "
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
