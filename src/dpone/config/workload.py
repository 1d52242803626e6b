"""Workload files: YAML -> validated, frozen settings. Every mistake is DPONE_CONFIG_INVALID."""

from __future__ import annotations

import os
import string
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import unquote, urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from dpone.contracts.load import ColumnType, LoadStrategy, is_identifier
from dpone.errors import ConfigInvalid

__all__ = [
    "AuditsConfig",
    "CsvSourceConfig",
    "DuckDbTargetConfig",
    "IncrementalConfig",
    "JsonlAppendTargetConfig",
    "JsonlSourceConfig",
    "LoadConfig",
    "MariaDbTableSourceConfig",
    "MariaDbTargetConfig",
    "ParquetSourceConfig",
    "PluginTargetConfig",
    "PostgresTableSourceConfig",
    "PostgresTargetConfig",
    "PublicationConfig",
    "PublicationTargetConfig",
    "RecoveryPolicy",
    "RestTargetConfig",
    "RetryConfig",
    "SqlSourceConfig",
    "SqliteTableSourceConfig",
    "SqliteTargetConfig",
    "Workload",
    "load_workload",
    "resolve_sqlite_url",
]

_FIXES = {
    "extra_forbidden": "remove it (check the spelling against the README's workload example)",
    "missing": "add it",
    "literal_error": "use one of the allowed values",
    "enum": "use one of the allowed values",
}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


def _identifier(value: str, *, qualified: bool = False) -> str:
    parts = value.split(".") if qualified else [value]
    if len(parts) > 2 or not all(is_identifier(p) for p in parts):
        shape = "[schema.]name" if qualified else "name"
        raise ValueError(
            f"{value!r} is not a plain identifier {shape}: use letters, digits and _, "
            "not starting with a digit"
        )
    return value


Identifier = Annotated[str, Field(min_length=1, max_length=63)]


_PATH_FIELDS = frozenset({"partition", "start", "end"})


def _path_template(value: str) -> str:
    """Check the placeholders of a source path: {partition}, {start:%Y-%m-%d}, {end:...}."""
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(value) if name is not None}
    except ValueError:
        raise ValueError(
            f"{value!r} has an unbalanced brace; placeholders are {{partition}}, "
            "{start:%Y-%m-%d} and {end:%Y-%m-%d}"
        ) from None
    unknown = sorted(fields - _PATH_FIELDS)
    if unknown:
        raise ValueError(
            f"unknown placeholder(s) {unknown} in the path; use {{partition}}, "
            "{start:FORMAT} or {end:FORMAT}"
        )
    return value


class _SourceConfig(_Model):
    path: str
    columns: dict[Identifier, ColumnType] | None = None

    @field_validator("columns")
    @classmethod
    def _columns(cls, value: dict[str, ColumnType] | None) -> dict[str, ColumnType] | None:
        for name in value or {}:
            _identifier(name)
        return value

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        return _path_template(value)


class CsvSourceConfig(_SourceConfig):
    kind: Literal["csv"]
    delimiter: str = Field(",", min_length=1, max_length=1)


class JsonlSourceConfig(_SourceConfig):
    kind: Literal["jsonl"]


class ParquetSourceConfig(_SourceConfig):
    kind: Literal["parquet"]


class _SqlSourceConfig(_Model):
    """An incremental SQL table source: rows with ``start <= cursor_column < cut``."""

    url: str | None = None
    url_env: str | None = None
    table: str
    cursor_column: Identifier = "updated_at"
    columns: dict[Identifier, ColumnType] | None = None

    @field_validator("table")
    @classmethod
    def _table(cls, value: str) -> str:
        return _identifier(value, qualified=True)

    @field_validator("cursor_column")
    @classmethod
    def _cursor(cls, value: str) -> str:
        return _identifier(value)

    @field_validator("columns")
    @classmethod
    def _columns(cls, value: dict[str, ColumnType] | None) -> dict[str, ColumnType] | None:
        for name in value or {}:
            _identifier(name)
        return value

    @model_validator(mode="after")
    def _one_url(self) -> _SqlSourceConfig:
        if (self.url is None) == (self.url_env is None):
            raise ValueError("give exactly one of url or url_env")
        return self


class PostgresTableSourceConfig(_SqlSourceConfig):
    kind: Literal["postgres_table"]


class MariaDbTableSourceConfig(_SqlSourceConfig):
    kind: Literal["mariadb_table"]


class SqliteTableSourceConfig(_SqlSourceConfig):
    kind: Literal["sqlite_table"]


SqlSourceConfig = PostgresTableSourceConfig | MariaDbTableSourceConfig | SqliteTableSourceConfig


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class IncrementalConfig(_Model):
    """Checkpointed (watermarked) loads: each COMPLETE interval moves the stream's watermark.

    ``start`` is the first watermark. A run without an explicit interval loads
    ``[watermark, now - lag_seconds)`` (at most ``max_interval_seconds`` long); the chosen
    interval is recorded in the journal and reused by every retry until it completes.
    """

    start: datetime
    lag_seconds: float = Field(0.0, ge=0, le=31_536_000)
    max_interval_seconds: float | None = Field(None, gt=0)

    @field_validator("start")
    @classmethod
    def _start(cls, value: datetime) -> datetime:
        return _utc(value)


class CustomAuditConfig(_Model):
    name: Identifier
    # a SELECT whose rows are violations; {table} stands for the target table
    query: str = Field(min_length=1, max_length=8192)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _identifier(value)

    @field_validator("query")
    @classmethod
    def _query(cls, value: str) -> str:
        text = value.strip().rstrip(";").strip()
        if not text.lower().startswith(("select", "with")) or ";" in text:
            raise ValueError(
                "an audit query must be one SELECT (or WITH ... SELECT) statement whose "
                "rows are the violations; use {table} for the target table"
            )
        return text


class AuditsConfig(_Model):
    """Write-audit-publish audits, run inside the write transaction before it commits."""

    min_rows: int | None = Field(None, ge=0)
    max_rows: int | None = Field(None, ge=0)
    not_null: list[Identifier] = Field(default_factory=list)
    unique_key: list[Identifier] = Field(default_factory=list)
    sql: list[CustomAuditConfig] = Field(default_factory=list)

    @field_validator("not_null", "unique_key")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        for name in value:
            _identifier(name)
        if len(set(value)) != len(value):
            raise ValueError("column names must be distinct")
        return value

    @model_validator(mode="after")
    def _bounds(self) -> AuditsConfig:
        if (
            self.min_rows is not None
            and self.max_rows is not None
            and self.min_rows > self.max_rows
        ):
            raise ValueError("min_rows is larger than max_rows")
        names = [a.name for a in self.sql]
        if len(set(names)) != len(names):
            raise ValueError("audit names in sql must be distinct")
        return self


_AUDITED_TARGETS = frozenset({"sqlite", "postgres", "mariadb", "mysql", "duckdb"})


class SqliteTargetConfig(_Model):
    kind: Literal["sqlite"]
    url: str | None = None
    url_env: str | None = None
    table: str

    @field_validator("table")
    @classmethod
    def _table(cls, value: str) -> str:
        return _identifier(value, qualified=True)

    @model_validator(mode="after")
    def _one_url(self) -> SqliteTargetConfig:
        if (self.url is None) == (self.url_env is None):
            raise ValueError("give exactly one of url or url_env")
        return self


class PostgresTargetConfig(_Model):
    kind: Literal["postgres"]
    url: str | None = None
    url_env: str | None = None
    table: str
    fence_schema: Identifier = "dpone"
    lock_timeout_seconds: float = Field(10.0, gt=0, le=3600)

    @field_validator("table")
    @classmethod
    def _table(cls, value: str) -> str:
        return _identifier(value, qualified=True)

    @field_validator("fence_schema")
    @classmethod
    def _fence_schema(cls, value: str) -> str:
        return _identifier(value)

    @model_validator(mode="after")
    def _one_url(self) -> PostgresTargetConfig:
        if (self.url is None) == (self.url_env is None):
            raise ValueError("give exactly one of url or url_env")
        return self


class _UrlTargetConfig(_Model):
    url: str | None = None
    url_env: str | None = None
    table: str
    lock_timeout_seconds: float = Field(10.0, gt=0, le=3600)

    @field_validator("table")
    @classmethod
    def _table(cls, value: str) -> str:
        return _identifier(value, qualified=True)

    @model_validator(mode="after")
    def _one_url(self) -> _UrlTargetConfig:
        if (self.url is None) == (self.url_env is None):
            raise ValueError("give exactly one of url or url_env")
        return self


class MariaDbTargetConfig(_UrlTargetConfig):
    kind: Literal["mariadb", "mysql"]
    fence_schema: Identifier | None = None


class DuckDbTargetConfig(_UrlTargetConfig):
    kind: Literal["duckdb"]


#: Entry-point group third-party connector packages register their factories in.
CONNECTOR_GROUP = "dpone.connectors"
_BUILTIN_TARGETS = (
    "sqlite",
    "postgres",
    "mariadb",
    "mysql",
    "duckdb",
    "jsonl_append",
    "publication",
    "rest",
)


def plugin_kinds() -> list[str]:
    """Names of installed third-party connectors (reads metadata, imports nothing)."""
    from importlib.metadata import entry_points

    return sorted(ep.name for ep in entry_points(group=CONNECTOR_GROUP))


class PluginTargetConfig(BaseModel):
    """A target of a third-party connector; its options go to the connector's factory."""

    model_config = ConfigDict(extra="allow", frozen=True)
    kind: str

    @field_validator("kind")
    @classmethod
    def _installed(cls, value: str) -> str:
        if value not in plugin_kinds():
            raise ValueError(
                f"unknown target kind {value!r}: built-in kinds are "
                f"{', '.join(_BUILTIN_TARGETS)}; installed connector packages provide "
                f"{', '.join(plugin_kinds()) or 'none'}"
            )
        return value

    def options(self) -> dict[str, object]:
        """The options given beside ``kind``."""
        return dict(self.model_extra or {})


def _target_tag(value: object) -> str:
    kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
    if kind == "mysql":
        return "mariadb"
    return kind if kind in _BUILTIN_TARGETS else "plugin"


class JsonlAppendTargetConfig(_Model):
    kind: Literal["jsonl_append"]
    path: str


_CREDENTIAL_REF = r"^(env:[A-Za-z_][A-Za-z0-9_]*|file:.+)$"


class RestTargetConfig(_Model):
    """A REST bulk receiver: the source is delivered as asynchronous remote jobs (section 14).

    The file names the receiver (``url`` or the variable ``url_env``), a credential
    *reference* (``env:NAME`` or ``file:PATH``, never the token), the receiver's limit
    of active jobs, the child size of a split delivery and the polling bounds.
    """

    kind: Literal["rest"]
    url: str | None = None
    url_env: str | None = None
    credential: str | None = None
    capacity: int | None = Field(None, ge=1, le=10_000)
    rows_per_child: int | None = Field(None, ge=1, le=100_000_000)
    chunk_bytes: int = Field(1 << 20, ge=1024, le=1 << 30)
    poll_interval_seconds: float = Field(5.0, ge=0.05, le=86_400)
    wait_budget_seconds: float = Field(30.0, ge=0, le=86_400)
    request_timeout_seconds: float = Field(10.0, gt=0, le=600)
    submit_lease_seconds: float = Field(60.0, gt=0, le=86_400)
    staging_dir: str = ".dpone/staging"

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else _receiver_url(value)

    @field_validator("credential")
    @classmethod
    def _credential(cls, value: str | None) -> str | None:
        import re

        if value is not None and not re.match(_CREDENTIAL_REF, value):
            raise ValueError(
                "the credential must be a reference, env:NAME or file:PATH, never the token itself"
            )
        return value

    @model_validator(mode="after")
    def _one_url(self) -> RestTargetConfig:
        if (self.url is None) == (self.url_env is None):
            raise ValueError("give exactly one of url or url_env")
        if self.submit_lease_seconds <= self.request_timeout_seconds:
            raise ValueError(
                "submit_lease_seconds must exceed request_timeout_seconds (a live submit "
                "must never look abandoned)"
            )
        return self


def _receiver_url(value: str) -> str:
    """``scheme://host[:port]/path`` of a receiver: http(s), no user info, query or fragment."""
    from urllib.parse import urlunsplit

    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        raise ValueError("the receiver URL is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("the receiver URL must be http(s)://host[:port][/path]")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ValueError(
            "the receiver URL may not carry user info, a query or a fragment; name the "
            "token with credential: env:NAME or file:PATH"
        )
    netloc = parts.hostname.lower() + (f":{port}" if port else "")
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


class PublicationTargetConfig(_Model):
    """The target of a publication workload: the object store named in ``publication``."""

    kind: Literal["publication"]


_PARTITION_RE = r"^[A-Za-z0-9][A-Za-z0-9_=-]{0,127}$"


class LocalStoreConfig(_Model):
    kind: Literal["local"]
    path: str


class S3StoreConfig(_Model):
    kind: Literal["s3"]
    bucket: str = Field(min_length=3, max_length=63)
    prefix: str = ""
    endpoint: str | None = None
    endpoint_env: str | None = None
    region: str = "us-east-1"
    # credentials are never written in the file: name the variables that hold them
    access_key_id_env: str | None = None
    secret_access_key_env: str | None = None

    @model_validator(mode="after")
    def _pairs(self) -> S3StoreConfig:
        if self.endpoint is not None and self.endpoint_env is not None:
            raise ValueError("give at most one of endpoint or endpoint_env")
        if (self.access_key_id_env is None) != (self.secret_access_key_env is None):
            raise ValueError("give both access_key_id_env and secret_access_key_env, or neither")
        return self


class AuditConfig(_Model):
    min_rows: int = Field(default=0, ge=0)
    not_null: list[Identifier] = Field(default_factory=list)

    @field_validator("not_null")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        for name in value:
            _identifier(name)
        return value


class PublicationConfig(_Model):
    """Write-audit-publish of one dataset: partitions -> staging generation -> manifest."""

    dataset: Identifier
    interval: str | None = None  # fixed START/END; else each command's --interval
    store: Annotated[LocalStoreConfig | S3StoreConfig, Field(discriminator="kind")]
    format: Literal["parquet", "csv"] = "parquet"
    partitions: list[Annotated[str, Field(pattern=_PARTITION_RE)]] | None = None
    partitions_from_source: bool = False
    audits: AuditConfig = Field(default_factory=AuditConfig)
    retention_hours: float = Field(168.0, ge=0)
    # optional pinned source manifest: partition -> sha256:<hex> of its source file
    source_hashes: dict[str, Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]] | None = None

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, value: str) -> str:
        return _identifier(value)

    @field_validator("interval")
    @classmethod
    def _interval(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from dpone.contracts.identity import parse_interval

        try:
            return parse_interval(value).canonical()
        except ConfigInvalid as exc:
            raise ValueError(exc.message) from None

    @model_validator(mode="after")
    def _one_partition_set(self) -> PublicationConfig:
        if (self.partitions is None) == (not self.partitions_from_source):
            raise ValueError(
                "give the expected partitions: either partitions: [p1, p2, ...] or "
                "partitions_from_source: true (one per file matching source.path's {partition})"
            )
        if self.partitions is not None:
            if not self.partitions:
                raise ValueError("partitions must not be empty")
            if len(set(self.partitions)) != len(self.partitions):
                raise ValueError("partitions must be distinct")
        return self


class LoadConfig(_Model):
    strategy: LoadStrategy
    key: list[Identifier] = Field(default_factory=list)
    interval_column: Identifier | None = None
    batch_size: int = Field(10_000, ge=1, le=1_000_000)

    @field_validator("key")
    @classmethod
    def _key(cls, value: list[str]) -> list[str]:
        for name in value:
            _identifier(name)
        if len(set(value)) != len(value):
            raise ValueError("key columns must be distinct")
        return value

    @field_validator("interval_column")
    @classmethod
    def _interval_column(cls, value: str | None) -> str | None:
        return None if value is None else _identifier(value)

    @model_validator(mode="after")
    def _strategy_needs(self) -> LoadConfig:
        if self.strategy is LoadStrategy.MERGE and not self.key:
            raise ValueError("strategy merge needs key: [column, ...] (the upsert key)")
        if self.strategy is LoadStrategy.REPLACE_INTERVAL and not self.interval_column:
            raise ValueError(
                "strategy replace_interval needs interval_column (the column whose value "
                "places a row in an interval)"
            )
        return self


class RecoveryPolicy(_Model):
    authorized_principals: list[str] = Field(default_factory=list)


class RetryConfig(_Model):
    """Retries of transient failures inside one run (docs/runs-and-retries.md); off by default."""

    attempts: int = Field(default=1, ge=1, le=100)
    budget_seconds: float = Field(default=60.0, gt=0, le=86_400)
    wait_initial_seconds: float = Field(default=0.5, ge=0, le=3_600)
    wait_max_seconds: float = Field(default=10.0, ge=0, le=3_600)
    wait_jitter_seconds: float = Field(default=0.5, ge=0, le=3_600)
    wait_exp_base: float = Field(default=2.0, ge=1, le=10)


class Workload(_Model):
    """A validated workload file. ``base_dir`` anchors relative paths and URLs."""

    workload: Identifier
    release: str = Field(min_length=1, max_length=128)
    deployment: str = Field(min_length=1, max_length=128)
    journal: str | None = None
    journal_env: str | None = None
    journal_schema: Identifier = "dpone"
    lease_ttl_seconds: float = Field(60.0, gt=0, le=86_400)
    source: Annotated[
        CsvSourceConfig
        | JsonlSourceConfig
        | ParquetSourceConfig
        | PostgresTableSourceConfig
        | MariaDbTableSourceConfig
        | SqliteTableSourceConfig,
        Field(discriminator="kind"),
    ]
    target: Annotated[
        Annotated[SqliteTargetConfig, Tag("sqlite")]
        | Annotated[PostgresTargetConfig, Tag("postgres")]
        | Annotated[MariaDbTargetConfig, Tag("mariadb")]
        | Annotated[DuckDbTargetConfig, Tag("duckdb")]
        | Annotated[JsonlAppendTargetConfig, Tag("jsonl_append")]
        | Annotated[PublicationTargetConfig, Tag("publication")]
        | Annotated[RestTargetConfig, Tag("rest")]
        | Annotated[PluginTargetConfig, Tag("plugin")],
        Discriminator(_target_tag),
    ]
    load: LoadConfig
    recovery: RecoveryPolicy = Field(default_factory=RecoveryPolicy)
    incremental: IncrementalConfig | None = None
    audits: AuditsConfig | None = None
    retry: RetryConfig = RetryConfig()  # frozen: one shared default is safe
    # deployment policy: recover automatically only on a route with valid certification
    # evidence (dpone certify) for this connector, capability and target database
    require_certified: bool = False
    certification_dir: str | None = None
    #: write-audit-publish of partitions into an object store (docs/publication.md)
    publication: PublicationConfig | None = None
    base_dir: Path = Field(default=Path(), exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _publication_defaults(cls, data: Any) -> Any:
        """A publication workload needs no target or load: its target is the store."""
        if isinstance(data, dict) and data.get("publication") is not None:
            data = {"target": {"kind": "publication"}, "load": {"strategy": "replace"}, **data}
        target = data.get("target") if isinstance(data, dict) else None
        if isinstance(target, dict) and target.get("kind") == "rest" and "load" not in data:
            data = {**data, "load": {"strategy": "append"}}  # a receiver job appends
        return data

    @field_validator("workload", "journal_schema")
    @classmethod
    def _workload(cls, value: str) -> str:
        return _identifier(value)

    @model_validator(mode="after")
    def _journal_once(self) -> Workload:
        if self.journal is not None and self.journal_env is not None:
            raise ValueError("give at most one of journal or journal_env")
        if self.target.kind == "jsonl_append" and self.load.strategy is not LoadStrategy.APPEND:
            raise ValueError("target kind jsonl_append supports only load.strategy append")
        if self.audits is not None and self.target.kind not in _AUDITED_TARGETS:
            raise ValueError(
                f"audits run inside a SQL target's transaction; target kind {self.target.kind!r} "
                f"has none (audited kinds: {', '.join(sorted(_AUDITED_TARGETS))})"
            )
        if self.target.kind == "rest" and self.load.strategy is not LoadStrategy.APPEND:
            raise ValueError(
                "target kind rest delivers rows as receiver jobs: use load.strategy append "
                "(or leave load out)"
            )
        if (self.target.kind == "publication") != (self.publication is not None):
            raise ValueError("target kind publication goes with a publication: section")
        if self.publication is not None:
            if self.load.strategy is not LoadStrategy.REPLACE:
                raise ValueError("a publication replaces partitions: use load.strategy replace")
            if not isinstance(getattr(self.source, "path", None), str):
                raise ValueError("a publication reads source files: use a csv or jsonl source")
            if "{partition" not in getattr(self.source, "path", ""):
                raise ValueError(
                    "a publication reads one source file per partition: put {partition} "
                    "in source.path"
                )
        return self

    # -------------------------------------------------------------- resolution
    def resolve_path(self, raw: str) -> Path:
        """Return ``raw`` as an absolute path, relative ones anchored at the workload file."""
        path = Path(raw).expanduser()
        return path if path.is_absolute() else (self.base_dir / path).resolve()

    def journal_url(self, environ: dict[str, str] | None = None) -> str:
        """Return the journal URL: ``journal``, ``journal_env``, DPONE_JOURNAL, or the default."""
        env = os.environ if environ is None else environ
        if self.journal is not None:
            return self.journal
        if self.journal_env is not None:
            value = env.get(self.journal_env)
            if not value:
                raise ConfigInvalid(
                    f"journal_env names {self.journal_env}, which is not set",
                    field="journal_env",
                    hint=f"export {self.journal_env}=sqlite:///path/to/journal.db",
                )
            return value
        return env.get("DPONE_JOURNAL") or "sqlite:///.dpone/journal.db"

    def source_url(self, environ: dict[str, str] | None = None) -> str:
        """Return an SQL source's URL from ``url`` or the variable ``url_env`` names."""
        env = os.environ if environ is None else environ
        source = self.source
        if not isinstance(source, _SqlSourceConfig):
            raise ConfigInvalid("this source has no URL", field="source")
        return _url_of(source.url, source.url_env, env, "source", "the source database's URL")

    def target_url(self, environ: dict[str, str] | None = None) -> str:
        """Return the target URL from ``url`` or the variable ``url_env`` names."""
        env = os.environ if environ is None else environ
        target = self.target
        if not isinstance(
            target,
            SqliteTargetConfig | PostgresTargetConfig | _UrlTargetConfig | RestTargetConfig,
        ):
            raise ConfigInvalid("this target has no URL", field="target")
        url = _url_of(target.url, target.url_env, env, "target", "the target's URL")
        if isinstance(target, RestTargetConfig) and target.url_env is not None:
            try:
                return _receiver_url(url)
            except ValueError as exc:
                raise ConfigInvalid(
                    f"target.url_env names {target.url_env}, whose value is not a receiver "
                    f"URL: {exc}",
                    field="target.url_env",
                    hint="export the receiver's base URL, e.g. https://bulk.example.com/api",
                ) from None
        return url


def _url_of(
    url: str | None, url_env: str | None, env: Mapping[str, str], section: str, what: str
) -> str:
    """``url`` as given, else the value of the variable ``url_env`` names (never empty)."""
    if url is not None:
        return url
    name = url_env or ""
    value = env.get(name)
    if not value:
        raise ConfigInvalid(
            f"{section}.url_env names {name}, which is not set",
            field=f"{section}.url_env",
            hint=f"export {name}=<{what}>",
        )
    return value


def resolve_file_url(url: str, *, scheme: str, base_dir: Path, field: str) -> Path:
    """Turn ``<scheme>:///rel.db`` or ``<scheme>:////abs.db`` into an absolute path."""
    if not url.startswith(f"{scheme}:"):
        raise ConfigInvalid(
            f"{field} must be a {scheme} URL such as {scheme}:///warehouse.{scheme}",
            field=field,
        )
    return resolve_sqlite_url("sqlite:" + url[len(scheme) + 1 :], base_dir=base_dir, field=field)


def resolve_sqlite_url(url: str, *, base_dir: Path, field: str) -> Path:
    """Turn ``sqlite:///rel.db`` or ``sqlite:////abs.db`` into an absolute path.

    User info is ignored (SQLite has no authentication) and never echoed or stored.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        parts = None
    if parts is None or parts.scheme != "sqlite" or not parts.path.strip("/"):
        raise ConfigInvalid(
            f"{field} must be a sqlite URL such as sqlite:///warehouse.db "
            "(relative to the workload file) or sqlite:////abs/path.db",
            field=field,
            hint="check the scheme and the path; other databases arrive with their extras",
        )
    if parts.query or parts.fragment or (parts.hostname not in (None, "", "localhost")):
        raise ConfigInvalid(
            f"{field} has a host, query or fragment, which sqlite URLs do not take",
            field=field,
            hint="write sqlite:///path/to/file.db",
        )
    raw = unquote(parts.path)
    # SQLAlchemy's convention: sqlite:///rel.db is relative, sqlite:////abs.db absolute
    path = Path(raw[1:])
    path = (path if path.is_absolute() else (base_dir / path)).resolve()
    if path.is_dir():
        raise ConfigInvalid(
            f"{field} names a directory, not a database file",
            field=field,
            hint="end the URL with a file name, e.g. sqlite:///warehouse.db",
        )
    return path


_UNION_TAGS = frozenset(
    {
        "csv",
        "jsonl",
        "parquet",
        "postgres_table",
        "mariadb_table",
        "sqlite_table",
        "sqlite",
        "postgres",
        "mariadb",
        "duckdb",
        "jsonl_append",
        "rest",
        "plugin",
        "local",
        "s3",
    }
)


def _format(error: ValidationError) -> ConfigInvalid:
    lines = []
    first_field = None
    for item in error.errors():
        loc = ".".join(
            str(p) for p in item["loc"] if not str(p).startswith(("function-", "tagged"))
        )
        # drop the union tags pydantic puts in the location: "target.sqlite.url" -> "target.url"
        parts = [p for p in loc.split(".") if p not in _UNION_TAGS]
        loc = ".".join(parts)
        first_field = first_field or loc or "workload"
        message = item["msg"].removeprefix("Value error, ")
        fix = _FIXES.get(item["type"], "")
        if item["type"] in ("literal_error", "enum", "union_tag_invalid") and item.get("ctx"):
            expected = item["ctx"].get("expected") or item["ctx"].get("expected_tags")
            fix = f"use one of: {expected}" if expected else fix
        lines.append(f"{loc or '(top level)'}: {message}" + (f" -> {fix}" if fix else ""))
    return ConfigInvalid(
        "workload file is invalid:\n  " + "\n  ".join(lines),
        field=first_field,
        hint="fix the fields listed above; see the README for a complete workload file",
    )


def parse_workload(data: Any, *, base_dir: Path) -> Workload:
    """Validate a mapping (already parsed from YAML) into a :class:`Workload`."""
    if not isinstance(data, dict):
        raise ConfigInvalid(
            "workload file must be a YAML mapping of fields",
            field="workload",
            hint="start from the README's workload example",
        )
    try:
        return Workload.model_validate({**data, "base_dir": base_dir})
    except ValidationError as exc:
        raise _format(exc) from None


def load_workload(path: str | Path) -> Workload:
    """Read and validate a workload file; every problem is a ``ConfigInvalid``."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigInvalid(
            f"workload file {file} does not exist",
            field="workload",
            hint="pass the path of a workload YAML file",
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigInvalid(
            f"workload file {file} cannot be read ({type(exc).__name__})", field="workload"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigInvalid(
            f"workload file {file} is not valid YAML{where}",
            field="workload",
            hint="check indentation and quoting",
        ) from None
    return parse_workload(data, base_dir=file.resolve().parent)
