"""Workload files: YAML -> validated, frozen settings. Every mistake is DPONE_CONFIG_INVALID.

The settings are msgspec Structs (ADR 0010): unknown fields are refused, values are
converted leniently the way a YAML author expects ("60" for a number), every string value
has its surrounding spaces stripped, and the checks of one section run in its
``__post_init__``. A check names its field by raising :class:`_Invalid`; no error repeats
a value of the file (it may be a secret in the wrong place). The ``kind`` of
``source``, ``target`` and ``publication.store`` picks the class to validate against
(:func:`_part`); a ``target.kind`` that is no built-in is a third-party connector's.
"""

from __future__ import annotations

import os
import re
import string
from collections.abc import Collection, Mapping
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias, TypeVar
from urllib.parse import unquote, urlsplit

import msgspec

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
    "parse_workload",
    "replace",
    "resolve_sqlite_url",
    "shown_variable",
    "to_json_dict",
]

_EXTRA_FIX = "remove it (check the spelling against the README's workload example)"
#: a name shown in an error: a value of the file is never shown (it may be a pasted secret)
_SHOWN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


class _Model(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """A section of a workload file: unknown fields refused, frozen once validated."""


class _Invalid(ValueError):
    """A check failed; ``field`` (dotted, relative to the section checked) names what."""

    def __init__(self, field: str, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.field = field
        self.message = message
        self.fix = fix


def _identifier(value: str, field: str, *, qualified: bool = False) -> None:
    parts = value.split(".") if qualified else [value]
    if len(parts) > 2 or not all(is_identifier(p) for p in parts):
        shape = "[schema.]name" if qualified else "name"
        raise _Invalid(
            field,
            f"Input is not a plain identifier {shape}: use letters, digits and _, "
            "not starting with a digit",
        )


def _names(values: Collection[str], field: str, *, distinct: str = "") -> None:
    """Each of ``values`` is a plain identifier; if ``distinct`` says what, none repeats."""
    for name in values:
        _identifier(name, field)
    if distinct and len(set(values)) != len(values):
        raise _Invalid(field, f"{distinct} must be distinct")


def _one_url(url: str | None, url_env: str | None) -> None:
    if (url is None) == (url_env is None):
        raise ValueError("give exactly one of url or url_env")


Identifier = Annotated[str, msgspec.Meta(min_length=1, max_length=63)]


_PATH_FIELDS = frozenset({"partition", "start", "end"})


def _path_template(value: str) -> None:
    """Check the placeholders of a source path: {partition}, {start:%Y-%m-%d}, {end:...}."""
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(value) if name is not None}
    except ValueError:
        raise _Invalid(
            "path",
            "the path has an unbalanced brace; placeholders are {partition}, "
            "{start:%Y-%m-%d} and {end:%Y-%m-%d}",
        ) from None
    unknown = sorted(fields - _PATH_FIELDS)
    if unknown:
        shown = [name for name in unknown if _SHOWN_NAME.fullmatch(name)]
        raise _Invalid(
            "path",
            f"unknown placeholder(s) {shown if len(shown) == len(unknown) else ''} in the "
            "path; use {partition}, {start:FORMAT} or {end:FORMAT}",
        )


class _SourceConfig(_Model, kw_only=True, frozen=True):
    path: str
    columns: dict[Identifier, ColumnType] | None = None

    def __post_init__(self) -> None:
        _path_template(self.path)
        _names(self.columns or {}, "columns")


class CsvSourceConfig(_SourceConfig, kw_only=True, frozen=True):
    kind: Literal["csv"]
    delimiter: Annotated[str, msgspec.Meta(min_length=1, max_length=1)] = ","


class JsonlSourceConfig(_SourceConfig, kw_only=True, frozen=True):
    kind: Literal["jsonl"]


class ParquetSourceConfig(_SourceConfig, kw_only=True, frozen=True):
    kind: Literal["parquet"]


class _SqlSourceConfig(_Model, kw_only=True, frozen=True):
    """An incremental SQL table source: rows with ``start <= cursor_column < cut``."""

    url: str | None = None
    url_env: str | None = None
    table: str
    cursor_column: Identifier = "updated_at"
    columns: dict[Identifier, ColumnType] | None = None

    def __post_init__(self) -> None:
        _identifier(self.table, "table", qualified=True)
        _identifier(self.cursor_column, "cursor_column")
        _names(self.columns or {}, "columns")
        _one_url(self.url, self.url_env)


class PostgresTableSourceConfig(_SqlSourceConfig, kw_only=True, frozen=True):
    kind: Literal["postgres_table"]


class MariaDbTableSourceConfig(_SqlSourceConfig, kw_only=True, frozen=True):
    kind: Literal["mariadb_table"]


class SqliteTableSourceConfig(_SqlSourceConfig, kw_only=True, frozen=True):
    kind: Literal["sqlite_table"]


SqlSourceConfig = PostgresTableSourceConfig | MariaDbTableSourceConfig | SqliteTableSourceConfig


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class IncrementalConfig(_Model, kw_only=True, frozen=True):
    """Checkpointed (watermarked) loads: each COMPLETE interval moves the stream's watermark.

    ``start`` is the first watermark. A run without an explicit interval loads
    ``[watermark, now - lag_seconds)`` (at most ``max_interval_seconds`` long); the chosen
    interval is recorded in the journal and reused by every retry until it completes.
    """

    start: datetime
    lag_seconds: Annotated[float, msgspec.Meta(ge=0, le=31_536_000)] = 0.0
    max_interval_seconds: Annotated[float, msgspec.Meta(gt=0)] | None = None

    def __post_init__(self) -> None:
        try:
            start = _utc(self.start)
        except OverflowError:  # 9999-12-31T23:00:00-05:00 is in year 10000 in UTC
            raise _Invalid(
                "start", "Input should be a timestamp within the years 1 to 9999 in UTC"
            ) from None
        msgspec.structs.force_setattr(self, "start", start)


class CustomAuditConfig(_Model, kw_only=True, frozen=True):
    name: Identifier
    # a SELECT whose rows are violations; {table} stands for the target table
    query: Annotated[str, msgspec.Meta(min_length=1, max_length=8192)]

    def __post_init__(self) -> None:
        _identifier(self.name, "name")
        text = self.query.strip().rstrip(";").strip()
        if not text.lower().startswith(("select", "with")) or ";" in text:
            raise _Invalid(
                "query",
                "an audit query must be one SELECT (or WITH ... SELECT) statement whose "
                "rows are the violations; use {table} for the target table",
            )
        msgspec.structs.force_setattr(self, "query", text)


class AuditsConfig(_Model, kw_only=True, frozen=True):
    """Write-audit-publish audits, run inside the write transaction before it commits."""

    min_rows: Annotated[int, msgspec.Meta(ge=0)] | None = None
    max_rows: Annotated[int, msgspec.Meta(ge=0)] | None = None
    not_null: list[Identifier] = []
    unique_key: list[Identifier] = []
    sql: list[CustomAuditConfig] = []

    def __post_init__(self) -> None:
        _names(self.not_null, "not_null", distinct="column names")
        _names(self.unique_key, "unique_key", distinct="column names")
        if (
            self.min_rows is not None
            and self.max_rows is not None
            and self.min_rows > self.max_rows
        ):
            raise ValueError("min_rows is larger than max_rows")
        names = [a.name for a in self.sql]
        if len(set(names)) != len(names):
            raise ValueError("audit names in sql must be distinct")


_AUDITED_TARGETS = frozenset({"sqlite", "postgres", "mariadb", "mysql", "duckdb"})


class SqliteTargetConfig(_Model, kw_only=True, frozen=True):
    kind: Literal["sqlite"]
    url: str | None = None
    url_env: str | None = None
    table: str

    def __post_init__(self) -> None:
        _identifier(self.table, "table", qualified=True)
        _one_url(self.url, self.url_env)


class PostgresTargetConfig(_Model, kw_only=True, frozen=True):
    kind: Literal["postgres"]
    url: str | None = None
    url_env: str | None = None
    table: str
    fence_schema: Identifier = "dpone"
    lock_timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 10.0

    def __post_init__(self) -> None:
        _identifier(self.table, "table", qualified=True)
        _identifier(self.fence_schema, "fence_schema")
        _one_url(self.url, self.url_env)


class _UrlTargetConfig(_Model, kw_only=True, frozen=True):
    url: str | None = None
    url_env: str | None = None
    table: str
    lock_timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 10.0

    def __post_init__(self) -> None:
        _identifier(self.table, "table", qualified=True)
        _one_url(self.url, self.url_env)


class MariaDbTargetConfig(_UrlTargetConfig, kw_only=True, frozen=True):
    kind: Literal["mariadb", "mysql"]
    fence_schema: Identifier | None = None


class DuckDbTargetConfig(_UrlTargetConfig, kw_only=True, frozen=True):
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


class PluginTargetConfig(msgspec.Struct, frozen=True):
    """A target of a third-party connector; its options go to the connector's factory.

    Built by :func:`_target` from the section as written (strings not stripped): ``kind``
    and, in ``extra``, every other field.
    """

    kind: str
    extra: dict[str, Any] = {}

    def options(self) -> dict[str, object]:
        """The options given beside ``kind``."""
        return dict(self.extra)

    if not TYPE_CHECKING:  # an option reads as an attribute too (getattr(target, "table"))

        def __getattr__(self, name: str) -> Any:
            if name.startswith("__") or name == "extra":
                raise AttributeError(name)
            try:
                return self.extra[name]
            except KeyError:
                raise AttributeError(name) from None


class JsonlAppendTargetConfig(_Model, kw_only=True, frozen=True):
    kind: Literal["jsonl_append"]
    path: str


_CREDENTIAL_REF = r"^(env:[A-Za-z_][A-Za-z0-9_]*|file:.+)$"


class RestTargetConfig(_Model, kw_only=True, frozen=True):
    """A REST bulk receiver: the source is delivered as asynchronous remote jobs (section 14).

    The file names the receiver (``url`` or the variable ``url_env``), a credential
    *reference* (``env:NAME`` or ``file:PATH``, never the token), the receiver's limit
    of active jobs, the child size of a split delivery and the polling bounds.
    """

    kind: Literal["rest"]
    url: str | None = None
    url_env: str | None = None
    credential: str | None = None
    capacity: Annotated[int, msgspec.Meta(ge=1, le=10_000)] | None = None
    rows_per_child: Annotated[int, msgspec.Meta(ge=1, le=100_000_000)] | None = None
    chunk_bytes: Annotated[int, msgspec.Meta(ge=1024, le=1 << 30)] = 1 << 20
    poll_interval_seconds: Annotated[float, msgspec.Meta(ge=0.05, le=86_400)] = 5.0
    wait_budget_seconds: Annotated[float, msgspec.Meta(ge=0, le=86_400)] = 30.0
    request_timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=600)] = 10.0
    submit_lease_seconds: Annotated[float, msgspec.Meta(gt=0, le=86_400)] = 60.0
    staging_dir: str = ".dpone/staging"

    def __post_init__(self) -> None:
        if self.url is not None:
            try:
                msgspec.structs.force_setattr(self, "url", _receiver_url(self.url))
            except ValueError as exc:
                raise _Invalid("url", str(exc)) from None
        if self.credential is not None and not re.match(_CREDENTIAL_REF, self.credential):
            raise _Invalid(
                "credential",
                "the credential must be a reference, env:NAME or file:PATH, never the token itself",
            )
        _one_url(self.url, self.url_env)
        if self.submit_lease_seconds <= self.request_timeout_seconds:
            raise ValueError(
                "submit_lease_seconds must exceed request_timeout_seconds (a live submit "
                "must never look abandoned)"
            )


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


class PublicationTargetConfig(_Model, kw_only=True, frozen=True):
    """The target of a publication workload: the object store named in ``publication``."""

    kind: Literal["publication"]


_PARTITION_RE = r"^[A-Za-z0-9][A-Za-z0-9_=-]{0,127}$"


class LocalStoreConfig(_Model, kw_only=True, frozen=True):
    kind: Literal["local"]
    path: str


class S3StoreConfig(_Model, kw_only=True, frozen=True):
    kind: Literal["s3"]
    bucket: Annotated[str, msgspec.Meta(min_length=3, max_length=63)]
    prefix: str = ""
    endpoint: str | None = None
    endpoint_env: str | None = None
    region: str = "us-east-1"
    # credentials are never written in the file: name the variables that hold them
    access_key_id_env: str | None = None
    secret_access_key_env: str | None = None

    def __post_init__(self) -> None:
        if self.endpoint is not None and self.endpoint_env is not None:
            raise ValueError("give at most one of endpoint or endpoint_env")
        if (self.access_key_id_env is None) != (self.secret_access_key_env is None):
            raise ValueError("give both access_key_id_env and secret_access_key_env, or neither")


class AuditConfig(_Model, kw_only=True, frozen=True):
    min_rows: Annotated[int, msgspec.Meta(ge=0)] = 0
    not_null: list[Identifier] = []

    def __post_init__(self) -> None:
        _names(self.not_null, "not_null")


class PublicationConfig(_Model, kw_only=True, frozen=True):
    """Write-audit-publish of one dataset: partitions -> staging generation -> manifest."""

    dataset: Identifier
    interval: str | None = None  # fixed START/END; else each command's --interval
    store: StoreConfig
    format: Literal["parquet", "csv"] = "parquet"
    partitions: list[Annotated[str, msgspec.Meta(pattern=_PARTITION_RE)]] | None = None
    partitions_from_source: bool = False
    audits: AuditConfig = msgspec.field(default_factory=AuditConfig)
    retention_hours: Annotated[float, msgspec.Meta(ge=0)] = 168.0
    # optional pinned source manifest: partition -> sha256:<hex> of its source file
    source_hashes: (
        dict[str, Annotated[str, msgspec.Meta(pattern=r"^sha256:[0-9a-f]{64}$")]] | None
    ) = None

    def __post_init__(self) -> None:
        _identifier(self.dataset, "dataset")
        if self.interval is not None:
            from dpone.contracts.identity import parse_interval

            try:
                canonical = parse_interval(self.interval).canonical()
            except (ConfigInvalid, ValueError, OverflowError):
                raise _Invalid(
                    "interval",
                    "Input should be START/END, ISO 8601 dates or times with START before END",
                    "write e.g. 2026-11-01/2026-11-02 or leave it out for --interval",
                ) from None
            msgspec.structs.force_setattr(self, "interval", canonical)
        store = _part(self.store, "store", _STORES, "store kind")
        msgspec.structs.force_setattr(self, "store", store)
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


class LoadConfig(_Model, kw_only=True, frozen=True):
    strategy: LoadStrategy
    key: list[Identifier] = []
    interval_column: Identifier | None = None
    batch_size: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 10_000

    def __post_init__(self) -> None:
        _names(self.key, "key", distinct="key columns")
        if self.interval_column is not None:
            _identifier(self.interval_column, "interval_column")
        if self.strategy is LoadStrategy.MERGE and not self.key:
            raise ValueError("strategy merge needs key: [column, ...] (the upsert key)")
        if self.strategy is LoadStrategy.REPLACE_INTERVAL and not self.interval_column:
            raise ValueError(
                "strategy replace_interval needs interval_column (the column whose value "
                "places a row in an interval)"
            )


class RecoveryPolicy(_Model, kw_only=True, frozen=True):
    authorized_principals: list[str] = []


class RetryConfig(_Model, kw_only=True, frozen=True):
    """Retries of transient failures inside one run (docs/runs-and-retries.md); off by default."""

    attempts: Annotated[int, msgspec.Meta(ge=1, le=100)] = 1
    budget_seconds: Annotated[float, msgspec.Meta(gt=0, le=86_400)] = 60.0
    wait_initial_seconds: Annotated[float, msgspec.Meta(ge=0, le=3_600)] = 0.5
    wait_max_seconds: Annotated[float, msgspec.Meta(ge=0, le=3_600)] = 10.0
    wait_jitter_seconds: Annotated[float, msgspec.Meta(ge=0, le=3_600)] = 0.5
    wait_exp_base: Annotated[float, msgspec.Meta(ge=1, le=10)] = 2.0


_SOURCES: dict[str, type[_Model]] = {
    "csv": CsvSourceConfig,
    "jsonl": JsonlSourceConfig,
    "parquet": ParquetSourceConfig,
    "postgres_table": PostgresTableSourceConfig,
    "mariadb_table": MariaDbTableSourceConfig,
    "sqlite_table": SqliteTableSourceConfig,
}
_TARGETS: dict[str, type[_Model]] = {
    "sqlite": SqliteTargetConfig,
    "postgres": PostgresTargetConfig,
    "mariadb": MariaDbTargetConfig,
    "mysql": MariaDbTargetConfig,
    "duckdb": DuckDbTargetConfig,
    "jsonl_append": JsonlAppendTargetConfig,
    "publication": PublicationTargetConfig,
    "rest": RestTargetConfig,
}
_STORES: dict[str, type[_Model]] = {"local": LocalStoreConfig, "s3": S3StoreConfig}

if TYPE_CHECKING:
    SourceConfig: TypeAlias = (
        CsvSourceConfig
        | JsonlSourceConfig
        | ParquetSourceConfig
        | PostgresTableSourceConfig
        | MariaDbTableSourceConfig
        | SqliteTableSourceConfig
    )
    TargetConfig: TypeAlias = (
        SqliteTargetConfig
        | PostgresTargetConfig
        | MariaDbTargetConfig
        | DuckDbTargetConfig
        | JsonlAppendTargetConfig
        | PublicationTargetConfig
        | RestTargetConfig
        | PluginTargetConfig
    )
    StoreConfig: TypeAlias = LocalStoreConfig | S3StoreConfig
else:
    # msgspec tells Structs in a union apart only by a tag, which would hide ``kind``
    # from attribute access: these fields arrive as mappings and __post_init__ validates
    # each against the class its ``kind`` names (_part)
    SourceConfig = TargetConfig = StoreConfig = Any


#: The targets whose location is a URL (``url`` or ``url_env``).
_URL_TARGETS = (SqliteTargetConfig, PostgresTargetConfig, _UrlTargetConfig, RestTargetConfig)


class Workload(_Model, kw_only=True, frozen=True):
    """A validated workload file. ``base_dir`` anchors relative paths and URLs."""

    workload: Identifier
    release: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    deployment: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    journal: str | None = None
    journal_env: str | None = None
    journal_schema: Identifier = "dpone"
    lease_ttl_seconds: Annotated[float, msgspec.Meta(gt=0, le=86_400)] = 60.0
    source: SourceConfig
    target: TargetConfig
    load: LoadConfig
    recovery: RecoveryPolicy = msgspec.field(default_factory=RecoveryPolicy)
    incremental: IncrementalConfig | None = None
    audits: AuditsConfig | None = None
    retry: RetryConfig = msgspec.field(default_factory=RetryConfig)
    # deployment policy: recover automatically only on a route with valid certification
    # evidence (dpone certify) for this connector, capability and target database
    require_certified: bool = False
    certification_dir: str | None = None
    #: write-audit-publish of partitions into an object store (docs/publication.md)
    publication: PublicationConfig | None = None
    base_dir: Path = Path()  # not in the file: the file's directory (to_json_dict omits it)

    def __post_init__(self) -> None:
        _identifier(self.workload, "workload")
        _identifier(self.journal_schema, "journal_schema")
        msgspec.structs.force_setattr(
            self, "source", _part(self.source, "source", _SOURCES, "source kind")
        )
        msgspec.structs.force_setattr(self, "target", _target(self.target))
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
                name = self.journal_env
                raise ConfigInvalid(
                    f"journal_env names {shown_variable(name)}, which is not set",
                    field="journal_env",
                    hint=f"export {shown_variable(name, 'NAME')}=sqlite:///path/to/journal.db",
                )
            return value
        return env.get("DPONE_JOURNAL") or "sqlite:///.dpone/journal.db"

    def check_environment(self, environ: dict[str, str] | None = None) -> None:
        """Resolve every URL the file names through a variable; raise if one is unset.

        The journal's, an SQL source's and a URL target's (``journal_env``, ``url_env``):
        what ``dpone check`` can say about the environment without connecting anywhere.
        """
        self.journal_url(environ)
        if isinstance(self.source, _SqlSourceConfig):
            self.source_url(environ)
        if isinstance(self.target, _URL_TARGETS):
            self.target_url(environ)

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
        if not isinstance(target, _URL_TARGETS):
            raise ConfigInvalid("this target has no URL", field="target")
        url = _url_of(target.url, target.url_env, env, "target", "the target's URL")
        if isinstance(target, RestTargetConfig) and target.url_env is not None:
            try:
                return _receiver_url(url)
            except ValueError as exc:
                raise ConfigInvalid(
                    f"target.url_env names {shown_variable(target.url_env)}, whose value is not a "
                    f"receiver URL: {exc}",
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
            f"{section}.url_env names {shown_variable(name)}, which is not set",
            field=f"{section}.url_env",
            hint=f"export {shown_variable(name, 'NAME')}=<{what}>",
        )
    return value


def shown_variable(name: str, otherwise: str = "a variable") -> str:
    """The variable ``name`` in a message, unless it is no plain name (a pasted secret?)."""
    return name if _SHOWN_NAME.fullmatch(name) else otherwise


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


# ------------------------------------------------------------------ validation
_S = TypeVar("_S", bound=msgspec.Struct)


def _part(value: object, field: str, classes: Mapping[str, type[_S]], what: str) -> _S:
    """Validate the section ``value`` against the class its ``kind`` names."""
    if isinstance(value, msgspec.Struct):  # already validated (replace() of a Workload)
        kind = getattr(value, "kind", None)
        if isinstance(kind, str) and type(value) is classes.get(kind):
            return value
        raise _Invalid(field, f"Expected a {what}'s section, got a {type(value).__name__}")
    if not isinstance(value, dict):
        raise _Invalid(field, f"Expected a mapping with a kind, got {_type_name(value)}")
    if "kind" not in value:
        raise _Invalid(f"{field}.kind", "Field required", "add it")
    cls = classes.get(value["kind"]) if isinstance(value["kind"], str) else None
    if cls is None:
        raise _Invalid(
            f"{field}.kind",
            f"Input is not a {what}",
            "use one of: " + ", ".join(repr(k) for k in classes),
        )
    try:
        return msgspec.convert(value, cls, strict=False)
    except msgspec.ValidationError as exc:
        inner, message, fix = _explain(exc)
        raise _Invalid(".".join([field, *inner]), message, fix) from None


def _target(value: object) -> msgspec.Struct:
    """A built-in target's section, or a third-party connector's (kind and options)."""
    if isinstance(value, PluginTargetConfig) and value.kind not in _BUILTIN_TARGETS:
        return value  # already validated (replace() of a Workload)
    kind = value.get("kind") if isinstance(value, dict) else None
    if not isinstance(value, dict) or kind in _BUILTIN_TARGETS or "kind" not in value:
        return _part(value, "target", _TARGETS, "target kind")
    if not isinstance(kind, str):
        raise _Invalid("target.kind", f"Expected `str`, got {_type_name(kind)}")
    installed = plugin_kinds()
    if kind not in installed:
        raise _Invalid(
            "target.kind",
            "Input is not a target kind: built-in kinds are "
            f"{', '.join(_BUILTIN_TARGETS)}; installed connector packages provide "
            f"{', '.join(installed) or 'none'}",
        )
    if not all(isinstance(k, str) for k in value):
        raise _Invalid("target", "a key: Input should be a string")
    return PluginTargetConfig(kind=kind, extra={k: v for k, v in value.items() if k != "kind"})


def _type_name(value: object) -> str:
    return "`null`" if value is None else f"`{type(value).__name__}`"


#: what the enum-like fields accept, for the hint of an invalid value
_CHOICES = {
    "strategy": [s.value for s in LoadStrategy],
    "columns[...]": [t.value for t in ColumnType],  # a value of the mapping
    "format": ["parquet", "csv"],
}
_TYPE_WORDS = {
    "object": "a mapping",
    "array": "a list",
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "null": "null",
    "datetime": "a timestamp",
}
_BOUND_WORDS = {
    ">=": "greater than or equal to",
    ">": "greater than",
    "<=": "less than or equal to",
    "<": "less than",
}


def _unknown_field(parts: list[str], name: str) -> tuple[list[str], str, str]:
    """The error of the unknown field ``name``, shown only if it reads as a field's name."""
    if _SHOWN_NAME.fullmatch(name.strip()):  # "strategy " too, as pydantic showed it
        return [*parts, name], "Extra inputs are not permitted", _EXTRA_FIX
    return parts, "an unknown field: Extra inputs are not permitted", _EXTRA_FIX


def _explain(error: msgspec.ValidationError) -> tuple[list[str], str, str]:
    """The field path, message and fix of msgspec's (first) error, in the file's terms.

    No value of the file is repeated (a secret may sit in the wrong field); the allowed
    values are listed instead.
    """
    text = str(error)
    found = re.fullmatch(r"(?s)(.*?)(?: - at (`key` in )?`\$([^`]*)`)?", text)
    message, key, path = found.groups() if found else (text, None, "")
    # "$.audits.sql[0].query" -> audits.sql.0.query; a dict value's key is not named ([...])
    parts = [p for p in re.split(r"[.\[\]]+", path or "") if p and p != "..."]
    # the field an enum-like value belongs to, "columns[...]" for a column's type
    field = (parts[-1] if parts else "") + ("[...]" if (path or "").endswith("[...]") else "")
    cause = error.__cause__
    if isinstance(cause, _Invalid):
        return parts + [p for p in cause.field.split(".") if p], cause.message, cause.fix
    fix = ""
    if named := re.fullmatch(r"(?s)Object contains unknown field `(.+)`", message):
        parts, message, fix = _unknown_field(parts, named[1])
    elif named := re.fullmatch(r"Object missing required field `(.+)`", message):
        parts.append(named[1])
        message, fix = "Field required", "add it"
    elif bound := re.fullmatch(r"Expected `(?:int|float)` (>=|>|<=|<) (\S+)", message):
        message = f"Input should be {_BOUND_WORDS[bound[1]]} {bound[2].removesuffix('.0')}"
    elif types := re.fullmatch(r"Expected `([^`]+)`, got `(\w+)`", message):
        expected = " or ".join(_TYPE_WORDS.get(t, t) for t in types[1].split(" | "))
        message = f"Input should be {expected}, got {_TYPE_WORDS.get(types[2], types[2])}"
        if field in _CHOICES:
            fix = "use one of: " + ", ".join(repr(c) for c in _CHOICES[field])
        elif types[1] == "str" and types[2] in ("int", "float"):
            fix = 'put it in quotes (YAML reads 2026.11 as a number, "2026.11" as text)'
    elif message == "Expected `str`":
        message = "Input should be a string"
    elif message == "Invalid RFC3339 encoded datetime":
        message = "Input should be a timestamp such as 2026-11-01T00:00:00Z"
    elif length := re.fullmatch(r"Expected `str` of length (>=|<=) (\d+)", message):
        count = f"{length[2]} character" + ("" if length[2] == "1" else "s")
        message = f"String should have {'at least' if length[1] == '>=' else 'at most'} {count}"
    elif pattern := re.fullmatch(r"Expected `str` matching regex (.+)", message):
        message = f"String should match pattern {pattern[1]}"
    elif message.startswith("Invalid enum value "):  # never echoed: it may be a secret
        message = "Input is not one of the allowed values"
        if field in _CHOICES:
            fix = "use one of: " + ", ".join(repr(c) for c in _CHOICES[field])
    if key:
        message = f"a key: {message}"
    return parts, message, fix


#: the fields of a workload file
_FILE_FIELDS = frozenset(Workload.__struct_fields__) - {"base_dir"}


def _lenient(data: dict[str, Any]) -> dict[str, Any]:
    """What the file means before it is checked: defaults by section, spaces stripped.

    A publication workload needs no target or load (its target is the store) and a rest
    target's load is an append. Surrounding spaces are stripped from every string value
    and from the names in ``columns`` and ``source_hashes``, never from a field's name
    (``"strategy "`` is an unknown field, as before), and a third-party connector's
    options go to it as written. ``incremental.start`` may be a date or any ISO 8601
    timestamp, as YAML authors write it. An unknown top-level field is refused before
    its value is read (:class:`_Copy` bounds what the others may expand to).
    """
    for name in data:
        if isinstance(name, str) and name not in _FILE_FIELDS:
            parts, message, fix = _unknown_field([], name)
            raise _Invalid(".".join(parts), message, fix)
    if data.get("publication") is not None:
        data = {"target": {"kind": "publication"}, "load": {"strategy": "replace"}, **data}
    target = data.get("target")
    kind = _stripped(target.get("kind")) if isinstance(target, dict) else None
    if kind == "rest" and "load" not in data:
        data = {**data, "load": {"strategy": "append"}}  # a receiver job appends
    plugin = isinstance(target, dict) and kind not in _BUILTIN_TARGETS
    copy = _Copy()
    data = {k: copy(v, (k,), strip=not (k == "target" and plugin)) for k, v in data.items()}
    incremental = data.get("incremental")
    if isinstance(incremental, dict) and "start" in incremental:
        data["incremental"] = {**incremental, "start": _timestamp(incremental["start"])}
    return data


def _stripped(value: object) -> object:
    return value.strip() if isinstance(value, str) else value


#: the mappings whose keys are names the file chooses, stripped like values (as before)
_FREE_MAPPINGS = frozenset({("source", "columns"), ("publication", "source_hashes")})
#: what a file may expand to: YAML aliases can repeat a value (exponentially, in a
#: "billion laughs") or put a mapping inside itself; past these bounds it is refused
_MAX_DEPTH = 32
_MAX_VALUES = 100_000


class _Copy:
    """Copies a file's values (strings stripped), refusing more than a workload needs.

    Text UTF-8 cannot encode (a lone surrogate, which YAML's "\\ud800" writes) is refused
    too, and so is a set (``!!set``): the operation identity digests the values as UTF-8,
    in an order that must not change from run to run.
    """

    def __init__(self) -> None:
        self.left = _MAX_VALUES

    def __call__(self, value: object, path: tuple[str, ...], *, strip: bool = True) -> object:
        """``value``, found at ``path``; ``strip`` strips its strings."""
        self.left -= 1
        if self.left < 0 or len(path) > _MAX_DEPTH:
            raise _Invalid(
                _where(path[:3]),
                f"the values nest more than {_MAX_DEPTH} deep or number more than "
                f"{_MAX_VALUES} (a YAML alias inside itself, or repeated aliases?)",
                "write the section out without aliases",
            )
        if isinstance(value, str):
            _encodable(value, path)
            return value.strip() if strip else value
        if isinstance(value, list):
            return [self(v, (*path, str(i)), strip=strip) for i, v in enumerate(value)]
        if isinstance(value, set | frozenset):  # its order, so the identity, varies by run
            raise _Invalid(
                _where(path), "Input should be a list: a YAML !!set has no order", "write [a, b]"
            )
        if not isinstance(value, dict):
            return value
        for key in value:
            if isinstance(key, str):
                _encodable(key, path)
        if path not in _FREE_MAPPINGS or not strip:
            return {k: self(v, (*path, str(k)), strip=strip) for k, v in value.items()}
        names = {k: _stripped(k) for k in value}
        if len(set(names.values())) != len(names):
            raise _Invalid(
                _where(path), "a name is given twice once its surrounding spaces are stripped"
            )
        return {names[k]: self(v, (*path, str(k))) for k, v in value.items()}


def _encodable(text: str, path: tuple[str, ...]) -> None:
    """Refuse ``text`` (found at ``path``) if UTF-8 cannot encode it: identities digest it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _Invalid(
            _where(path),
            "Input should be text UTF-8 can encode: it has a lone surrogate (e.g. \\ud800)",
            "write the character itself or remove it",
        ) from None


def _where(path: tuple[str, ...]) -> str:
    """``path`` as a field name, up to its first part that is no plain name or number."""
    shown: list[str] = []
    for part in path:
        if not (_SHOWN_NAME.fullmatch(part) or part.isdigit()):
            break
        shown.append(part)
    return ".".join(shown)


def _timestamp(value: object) -> object:
    """A date or an ISO 8601 string as a datetime; anything else as given (msgspec checks)."""
    if isinstance(value, date) and not isinstance(value, datetime):
        return datetime(value.year, value.month, value.day)
    if isinstance(value, str) and not value.isdigit():
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return value
    return value


def parse_workload(data: Any, *, base_dir: Path) -> Workload:
    """Validate a mapping (already parsed from YAML) into a :class:`Workload`."""
    if not isinstance(data, dict):
        raise ConfigInvalid(
            "workload file must be a YAML mapping of fields",
            field="workload",
            hint="start from the README's workload example",
        )
    try:
        return msgspec.convert({**_lenient(data), "base_dir": base_dir}, Workload, strict=False)
    except msgspec.ValidationError as exc:
        parts, message, fix = _explain(exc)
    except _Invalid as exc:  # found before validation (_lenient)
        parts, message, fix = [exc.field], exc.message, exc.fix
    where = ".".join(p for p in parts if p)
    raise ConfigInvalid(
        f"workload file is invalid:\n  {where or '(top level)'}: {message}"
        + (f" -> {fix}" if fix else ""),
        field=where or "workload",
        hint="fix the field named above; see the README for a complete workload file",
    )


def load_workload(path: str | Path, *, remember: bool = True) -> Workload:
    """Read and validate a workload file; every problem is a ``ConfigInvalid``.

    The parsed YAML of a file read before is taken from the workload cache
    (``dpone.config._parsed``, ADR 0015) without importing PyYAML; it is validated
    like a fresh parse. With ``remember`` False the cache is neither read nor written.
    """
    from dpone.config import _parsed

    file = Path(path)
    try:
        raw = file.read_bytes()
        # what read_text gives: universal newlines
        text = raw.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
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
    # without ``remember`` the cache is not even read: a hit marks its entry used
    data = _parsed.cached(raw) if remember else _parsed.MISS
    if data is not _parsed.MISS:
        return parse_workload(data, base_dir=file.resolve().parent)
    data = _parse_yaml(file, text)
    workload = parse_workload(data, base_dir=file.resolve().parent)
    if remember:
        _parsed.remember(raw, data)  # only a valid workload's document is kept
    return workload


def _parse_yaml(file: Path, text: str) -> Any:
    """The YAML document of a workload file (PyYAML's safe loader)."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigInvalid(
            f"workload file {file} is not valid YAML{where}",
            field="workload",
            hint="check indentation and quoting",
        ) from None
    except (RecursionError, ValueError):  # nested too deeply, an integer of 5000 digits
        raise ConfigInvalid(
            f"workload file {file} is not a workload's YAML (nested too deeply or a number "
            "too long)",
            field="workload",
            hint="start from the README's workload example",
        ) from None


# ------------------------------------------------------------------ helpers for callers
def to_json_dict(value: msgspec.Struct, *, exclude: Collection[str] = ()) -> dict[str, Any]:
    """``value``'s fields as JSON types (enums by value, datetimes in ISO 8601).

    The fields named in ``exclude`` are left out, and so is a workload's ``base_dir``.
    Operation identity digests this rendering (tests/unit/test_identity_pins.py).
    """
    skip = {*exclude, "base_dir"} if isinstance(value, Workload) else set(exclude)
    fields = {name: getattr(value, name) for name in value.__struct_fields__ if name not in skip}
    rendered: dict[str, Any] = msgspec.to_builtins(fields)
    return rendered


def replace(value: _S, **changes: Any) -> _S:
    """A copy of the settings ``value`` with ``changes``, checked again (``__post_init__``)."""
    return msgspec.structs.replace(value, **changes)
