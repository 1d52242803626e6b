"""Airflow connection -> dpone URL, with no import of dpone's configuration layer.

Shared by the worker (:mod:`dpone.airflow.connections`) and the triggerer
(:mod:`dpone.airflow.triggers`, which resolves a ``conn_id`` journal locator): both build
the URL of one connection the same way. The URL carries the connection's credentials, so
callers keep it in private memory only (never arguments, events, logs or the journal).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol
from urllib.parse import quote

from dpone.errors import ConfigInvalid

__all__ = ["ConnectionLike", "connection_url"]

_SERVER_SCHEMES = {
    "postgres": "postgresql",
    "postgresql": "postgresql",
    "mysql": "mysql",
    "mariadb": "mysql",
}
_FILE_SCHEMES = {"sqlite": "sqlite", "duckdb": "duckdb"}


class ConnectionLike(Protocol):
    """The fields of an Airflow ``Connection`` dpone reads (same in 2.x and 3.x)."""

    conn_id: str
    conn_type: str | None
    host: str | None
    schema: str | None
    login: str | None
    password: str | None
    port: int | None

    def get_uri(self) -> str:
        """Airflow's URI of the connection."""
        ...


def _server_url(conn: ConnectionLike, scheme: str) -> str:
    if not conn.host:
        raise ConfigInvalid(
            f"Airflow connection {conn.conn_id!r} has no host",
            field="conn_id",
            hint="set the connection's host, port, schema (database), login and password",
        )
    auth = ""
    if conn.login:
        auth = quote(conn.login, safe="")
        if conn.password:
            auth += ":" + quote(conn.password, safe="")
        auth += "@"
    port = f":{conn.port}" if conn.port else ""
    database = "/" + quote(conn.schema, safe="") if conn.schema else ""
    return f"{scheme}://{auth}{conn.host}{port}{database}"


def _file_url(conn: ConnectionLike, scheme: str) -> str:
    raw = conn.host or conn.schema
    if not raw:
        raise ConfigInvalid(
            f"Airflow connection {conn.conn_id!r} names no database file",
            field="conn_id",
            hint="put the database file's absolute path in the connection's host",
        )
    path = Path(raw).expanduser()
    if not path.is_absolute():
        raise ConfigInvalid(
            f"Airflow connection {conn.conn_id!r} names a relative database file",
            field="conn_id",
            hint="use an absolute path: workers may run in any directory",
        )
    return f"{scheme}:///{path}"


def connection_url(conn: ConnectionLike) -> str:
    """Return the dpone URL of an Airflow connection (credentials included: keep it private).

    PostgreSQL and MySQL/MariaDB connections become ``postgresql://`` / ``mysql://`` URLs;
    SQLite and DuckDB connections name the database file in ``host``; any other type
    falls back to Airflow's own ``get_uri()``.
    """
    kind = (conn.conn_type or "").lower()
    if kind in _SERVER_SCHEMES:
        return _server_url(conn, _SERVER_SCHEMES[kind])
    if kind in _FILE_SCHEMES:
        return _file_url(conn, _FILE_SCHEMES[kind])
    return conn.get_uri()
