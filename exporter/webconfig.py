"""Prometheus exporter-toolkit style web config: TLS and basic auth for /metrics.

The same YAML file Prometheus' own exporters take (`--web.config.file`), so a
platform team reuses its existing certificates, hashes and habits:

    tls_server_config:
      cert_file: server.crt
      key_file: server.key
      client_ca_file: ca.crt                  # optional: mutual TLS
      client_auth_type: RequireAndVerifyClientCert
      min_version: TLS12
    basic_auth_users:
      prometheus: $2y$10$...                  # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':')
"""
from __future__ import annotations

import base64
import enum
import functools
import hashlib
import os
import ssl
import threading
from dataclasses import dataclass, field
from typing import Mapping

import bcrypt
import yaml

_TLS_KEYS = {"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version"}
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}


class WebConfigError(ValueError):
    """The web config file is unreadable or wrong; the message says where."""


@functools.cache
def _stand_in_hash(rounds: int) -> bytes:
    """A hash no password matches, checked where a refusal must cost `rounds` of work."""
    return bcrypt.hashpw(b"burnrate: no such user", bcrypt.gensalt(rounds=rounds))


# bcrypt checks at once: each burns a core for ~60 ms by design, so a flood of wrong
# passwords waits its turn instead of taking every core from the exporter.
_CHECKS_AT_ONCE = 1
# How long a request waits for its turn before it is answered "busy": a queue of wrong
# passwords must not hold the right one for longer than a scrape waits.
_TURN_WAIT_S = 2.0


class Verdict(enum.Enum):
    ALLOWED = "allowed"
    REFUSED = "refused"
    BUSY = "busy"       # no check could start: too many at once, or this address has one going


def _rounds(hashed: bytes) -> int:
    """The cost of a `$2y$10$...` hash."""
    return int(hashed.split(b"$")[2])


def _credentials(header: str | None) -> tuple[str, str] | None:
    if not header or not header.startswith("Basic "):
        return None
    try:
        user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return None
    return user, password


def _matches(password: bytes, hashed: bytes) -> bool:
    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:      # bcrypt refuses passwords over 72 bytes: never a match
        return False


@dataclass
class WebConfig:
    tls: ssl.SSLContext | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    _verified: set[bytes] = field(default_factory=set, repr=False)
    _checking_for: set[str] = field(default_factory=set, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _turns: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(_CHECKS_AT_ONCE), repr=False)

    def __post_init__(self) -> None:
        # Made now, so that the first refusal costs what every later one does.
        if self.users:
            for rounds in range(min(map(_rounds, self.users.values())), self._dearest() + 1):
                _stand_in_hash(rounds)

    def _dearest(self) -> int:
        return max(map(_rounds, self.users.values()), default=0)

    def authorize(self, header: str | None, client: str) -> Verdict:
        """ALLOWED when no users are configured or the Basic credentials match a hash.
        `client` (the peer's address) has at most one check waiting or running: a flood
        from one address cannot queue ahead of everyone else."""
        if not self.users:
            return Verdict.ALLOWED
        credentials = _credentials(header)
        if credentials is None:
            return Verdict.REFUSED
        user, password = credentials
        hashed = self.users.get(user)
        # bcrypt costs ~100 ms by design; remember credentials already verified so
        # that a scrape every few seconds stays fast (exporter-toolkit caches too).
        token = hashlib.sha256(user.encode() + b"\0" + password.encode() + b"\0" + (hashed or b"")).digest()
        with self._lock:
            if token in self._verified:
                return Verdict.ALLOWED
            if client in self._checking_for:
                return Verdict.BUSY
            self._checking_for.add(client)
        try:
            if not self._turns.acquire(timeout=_TURN_WAIT_S):
                return Verdict.BUSY
            try:
                ok = self._check(password.encode(), hashed)
            finally:
                self._turns.release()
        finally:
            with self._lock:
                self._checking_for.discard(client)
        if ok:
            with self._lock:
                self._verified.add(token)
        return Verdict.ALLOWED if ok else Verdict.REFUSED

    def _check(self, password: bytes, hashed: bytes | None) -> bool:
        """Every refusal costs one check at the dearest configured cost, so its timing tells
        neither which user names exist nor which are hashed cheaply."""
        dearest = self._dearest()
        if hashed is None:
            _matches(password, _stand_in_hash(dearest))
            return False
        if _matches(password, hashed):
            return True
        # bcrypt's work doubles with each round: checks at rounds r, r+1, ..., dearest-1
        # add to one at r exactly what one at `dearest` costs.
        for rounds in range(_rounds(hashed), dearest):
            _matches(password, _stand_in_hash(rounds))
        return False


def _tls_context(conf: dict, base: str) -> ssl.SSLContext:
    if not isinstance(conf, dict):
        raise WebConfigError("tls_server_config must be a mapping (cert_file, key_file, ...)")
    unknown = set(conf) - _TLS_KEYS
    if unknown:
        raise WebConfigError(f"unknown tls_server_config keys: {', '.join(sorted(unknown))}")
    if not conf.get("cert_file") or not conf.get("key_file"):
        raise WebConfigError("tls_server_config needs cert_file and key_file")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    version = conf.get("min_version", "TLS12")
    if version not in _VERSIONS:
        raise WebConfigError(f"min_version must be one of {', '.join(_VERSIONS)}")
    ctx.minimum_version = _VERSIONS[version]
    path = lambda p: os.path.join(base, str(p))  # noqa: E731 - relative to the config file, as exporter-toolkit does
    for key in ("cert_file", "key_file", "client_ca_file"):
        if conf.get(key) and not os.path.isfile(path(conf[key])):
            raise WebConfigError(f"tls_server_config {key}: no file at {path(conf[key])}")
    try:
        ctx.load_cert_chain(path(conf["cert_file"]), path(conf["key_file"]))
        auth = conf.get("client_auth_type", "NoClientCert")
        if auth not in _CLIENT_AUTH:
            raise WebConfigError(f"client_auth_type must be one of {', '.join(_CLIENT_AUTH)}")
        ctx.verify_mode = _CLIENT_AUTH[auth]
        if conf.get("client_ca_file"):
            ctx.load_verify_locations(path(conf["client_ca_file"]))
        elif ctx.verify_mode != ssl.CERT_NONE:
            raise WebConfigError(f"client_auth_type {auth} needs client_ca_file")
    except (OSError, ssl.SSLError) as exc:
        raise WebConfigError(f"cannot load TLS files: {exc}") from exc
    return ctx


def load(path: str) -> WebConfig:
    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise WebConfigError(f"cannot read web config {path}: {exc}") from exc
    if not isinstance(doc, dict):
        raise WebConfigError(f"web config {path} must be a mapping")
    unknown = set(doc) - {"tls_server_config", "basic_auth_users", "http_server_config"}
    if unknown:
        raise WebConfigError(f"unknown web config keys: {', '.join(sorted(unknown))}")
    base = os.path.dirname(os.path.abspath(path))
    tls = _tls_context(doc["tls_server_config"], base) if doc.get("tls_server_config") else None
    users = doc.get("basic_auth_users") or {}
    if not isinstance(users, dict) or not all(isinstance(h, str) and h.startswith("$2") for h in users.values()):
        raise WebConfigError("basic_auth_users must map user names to bcrypt hashes")
    for user, hashed in users.items():
        try:    # a malformed hash would fail every request; fail here, once, by name
            bcrypt.checkpw(b"", hashed.encode())
        except ValueError:
            raise WebConfigError(f"basic_auth_users: the hash of {user!r} is not a valid bcrypt hash") from None
    return WebConfig(tls=tls, users={str(u): h.encode() for u, h in users.items()})
