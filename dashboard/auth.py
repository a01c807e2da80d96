"""Optional HTTP basic auth for a shared deployment: one user, checked before every
request (pages, callbacks and assets alike) but the liveness probe's."""
from __future__ import annotations

import hmac
import os

import flask

REALM = "burnrate"
HEALTH = "/healthz"
"""Answered without credentials, as kubelet probes carry none; it says only that the app is up."""


def credentials(value: str) -> tuple[str, str]:
    """USER:PASSWORD, given as is or as the path of a file holding it (which keeps
    the password out of the process list). ValueError with a one-line message."""
    text = value
    if os.path.isfile(value):
        try:
            with open(value, encoding="utf-8") as fh:
                text = fh.read().strip()
        except OSError as exc:
            raise ValueError(f"cannot read {value}: {exc.strerror}") from None
    user, sep, password = text.partition(":")
    if not sep or not user or not password:
        raise ValueError("--basic-auth needs USER:PASSWORD (or a file holding USER:PASSWORD)")
    return user, password


def require_basic_auth(server: flask.Flask, user: str, password: str) -> None:
    expected = (user.encode(), password.encode())

    @server.before_request
    def check() -> flask.Response | None:
        if flask.request.path == HEALTH:
            return None
        given = flask.request.authorization
        if given is not None and given.type == "basic":
            # Both compared, in constant time, so timing tells nothing about which was wrong.
            ok_user = hmac.compare_digest((given.username or "").encode(), expected[0])
            ok_password = hmac.compare_digest((given.password or "").encode(), expected[1])
            if ok_user and ok_password:
                return None
        return flask.Response("authentication required\n", 401,
                              {"WWW-Authenticate": f'Basic realm="{REALM}", charset="UTF-8"'})


def add_health(server: flask.Flask) -> None:
    server.add_url_rule(HEALTH, "healthz", lambda: flask.Response("ok\n", 200, {"Content-Type": "text/plain"}))
