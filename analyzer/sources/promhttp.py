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
floats (`matrix`), several times quicker than JSON's lists of strings converted after.
"""
from __future__ import annotations

import itertools
import json
import socket
import ssl
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


class PrometheusError(RuntimeError):
    """Prometheus unreachable, too slow, or answering an error: one line for the user."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        where = urllib.parse.urljoin(req.full_url, newurl)
        raise PrometheusError(f"Prometheus at {_base(req.full_url)} redirected (HTTP {code}) to {where}; "
                              "credentials are not sent on: give that URL instead")


def _base(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


class PrometheusHTTP:
    def __init__(self, url: str, headers: Mapping[str, str], timeout_s: float,
                 context: ssl.SSLContext | None = None, max_bytes: int = MAX_ANSWER_BYTES) -> None:
        self.url, self.headers, self.timeout_s, self.max_bytes = url, dict(headers), timeout_s, max_bytes
        handlers: list = [_NoRedirect()]
        if context is not None:
            handlers.append(urllib.request.HTTPSHandler(context=context))
        self._opener = urllib.request.build_opener(*handlers)

    def data(self, path: str, params: Mapping[str, str], post: bool = True) -> dict:
        """`data` of a successful answer to GET or POST `path`; PrometheusError otherwise."""
        return self._decode(self._answer(self._request(path, params, post)))

    def matrix(self, path: str, params: Mapping[str, str]) -> list[dict]:
        """The series of a range query's answer (POST), each `{"metric": labels, "values":
        (n, 2) float array of times and values}`; PrometheusError otherwise."""
        raw = self._answer(self._request(path, params, post=True))
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

    def _answer(self, request: urllib.request.Request) -> bytes:
        where = f"Prometheus at {self.url}"
        late = PrometheusError(f"{where} did not answer within {self.timeout_s:g} s")
        deadline = time.monotonic() + self.timeout_s
        try:
            with self._opener.open(request, timeout=self.timeout_s) as resp:
                return self._read(resp, deadline, late)
        except urllib.error.HTTPError as exc:
            detail = api_error(exc.read(READ_BYTES)) or exc.reason
            raise PrometheusError(f"{where} answered HTTP {exc.code}: {detail}") from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, (socket.timeout, TimeoutError)):
                raise late from None
            raise PrometheusError(f"cannot reach {where}: {getattr(reason, 'strerror', None) or reason}") from None
        except (socket.timeout, TimeoutError):
            raise late from None
        except OSError as exc:
            raise PrometheusError(f"cannot reach {where}: {exc.strerror or exc}") from None

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
