"""A self-signed certificate for 127.0.0.1, made by openssl, for servers under test that speak TLS."""
from __future__ import annotations

import base64
import ssl
import subprocess

import bcrypt

from tests.conftest import require


def self_signed(directory, *dns_names: str) -> tuple[str, str]:
    """(certificate, key) paths in `directory`, for 127.0.0.1 and `dns_names`; the certificate
    is its own CA."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    names = ",".join(["IP:127.0.0.1", *(f"DNS:{name}" for name in dns_names)])
    subprocess.run([require("openssl"), "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", f"subjectAltName={names}",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return str(cert), str(key)


def trusting(cert: str) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=cert)


def web_config(cert: str, key: str, user: str, password: str) -> str:
    """exporter-toolkit's web config (Prometheus' and the agent's): TLS, and one user by bcrypt hash."""
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
    return (f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
            f"basic_auth_users:\n  {user}: '{hashed}'\n")


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
