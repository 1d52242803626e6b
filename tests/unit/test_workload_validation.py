"""Workload validation (msgspec, ADR 0010): what is accepted, how mistakes read, start-up cost."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pytest

from dpone.config.workload import (
    PluginTargetConfig,
    RestTargetConfig,
    Workload,
    parse_workload,
    replace,
    to_json_dict,
)
from dpone.errors import ConfigInvalid
from dpone.testing.crash import write_orders_csv

BASE: dict[str, Any] = {
    "workload": "w",
    "release": "r",
    "deployment": "d",
    "source": {"kind": "csv", "path": "a.csv"},
    "target": {"kind": "sqlite", "url": "sqlite:///t.db", "table": "t"},
    "load": {"strategy": "append"},
}


def _parse(**changes: Any) -> Workload:
    return parse_workload({**BASE, **changes}, base_dir=Path("/w"))


def _invalid(**changes: Any) -> ConfigInvalid:
    with pytest.raises(ConfigInvalid) as caught:
        _parse(**changes)
    assert caught.value.code.value == "DPONE_CONFIG_INVALID"
    return caught.value


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"surprise": 1}, "surprise", "Extra inputs are not permitted -> remove it (check the"),
        ({"load": {"strategy": "append", "batchsize": 5}}, "load.batchsize", "remove it"),
        ({"release": None}, "release", "Input should be a string, got null"),
        ({"release": 2026.11}, "release", "put it in quotes"),
        ({"retry": {"attempts": 0}}, "retry.attempts", "greater than or equal to 1"),
        ({"lease_ttl_seconds": 0}, "lease_ttl_seconds", "Input should be greater than 0"),
        ({"load": {"strategy": "upsert"}}, "load.strategy", "use one of: 'append', 'replace'"),
        ({"load": {"strategy": "merge"}}, "load", "strategy merge needs key"),
        ({"load": {"strategy": "append", "key": "id"}}, "load.key", "should be a list"),
        ({"source": {"kind": "xml", "path": "a"}}, "source.kind", "use one of: 'csv', 'jsonl'"),
        ({"source": {"path": "a.csv"}}, "source.kind", "Field required -> add it"),
        ({"source": "a.csv"}, "source", "a mapping with a kind"),
        ({"source": {"kind": "csv", "path": "a{x}.csv"}}, "source.path", "placeholder"),
        (
            {"source": {"kind": "csv", "path": "a", "columns": {"9a": "text"}}},
            "source.columns",
            "not a plain identifier",
        ),
        (
            {"source": {"kind": "csv", "path": "a", "columns": {"a": "int"}}},
            "source.columns",
            "'integer', 'real'",
        ),
        ({"target": {"kind": "sqlite", "url": "sqlite:///t.db"}}, "target.table", "add it"),
        ({"target": {"kind": "sqlite", "table": "t"}}, "target", "exactly one of url"),
        ({"target": {"kind": "exampel_append"}}, "target.kind", "example_append"),
        (
            {"audits": {"sql": [{"name": "n", "query": "delete from t"}]}},
            "audits.sql.0.query",
            "one SELECT",
        ),
        ({"incremental": {"start": "soon"}}, "incremental.start", "2026-11-01T00:00:00Z"),
        ({"journal": "sqlite:///j.db", "journal_env": "J"}, "workload", "(top level): give at"),
    ],
)
def test_a_mistake_names_its_field_and_what_to_do(
    changes: dict[str, Any], field: str, words: str
) -> None:
    error = _invalid(**changes)
    assert error.field == field, error.message
    assert error.message.startswith("workload file is invalid:\n  ")
    assert words in error.message
    assert "see the README" in (error.hint or "")


def test_the_first_mistake_is_reported() -> None:
    """msgspec stops at the first error: one line, never a traceback of the validator."""
    error = _invalid(surprise=1, release=None)
    assert error.message.count("\n") == 1


def test_yaml_values_are_read_leniently() -> None:
    """Numbers as text, integral floats, padded strings, dates and ISO timestamps."""
    workload = _parse(
        lease_ttl_seconds="30",
        source={"kind": " csv ", "path": " a.csv ", "columns": {" id ": "integer"}},
        load={"strategy": "merge", "key": [" id "], "batch_size": 500.0},
        incremental={"start": date(2026, 11, 1), "lag_seconds": 5},
    )
    assert workload.lease_ttl_seconds == 30.0
    assert workload.incremental is not None
    assert workload.incremental.start == datetime(2026, 11, 1, tzinfo=UTC)
    assert isinstance(workload.incremental.lag_seconds, float)
    assert (workload.source.kind, workload.source.path) == ("csv", "a.csv")
    assert workload.source.columns is not None
    assert list(workload.source.columns) == ["id"]
    assert (workload.load.key, workload.load.batch_size) == (["id"], 500)
    for start in ("2026-11-01", "2026-11-01 02:00:00+02:00", "2026-11-01T00:00"):
        incremental = _parse(incremental={"start": start}).incremental
        assert incremental is not None
        assert incremental.start == datetime(2026, 11, 1, tzinfo=UTC), start


def test_a_tab_delimiter_is_still_stripped_away() -> None:
    """Stripping comes first, as before: a lone tab is an empty delimiter (a known gap)."""
    error = _invalid(source={"kind": "csv", "path": "a", "delimiter": "\t"})
    assert error.field == "source.delimiter"


def test_a_plugin_target_keeps_its_options_as_written() -> None:
    workload = _parse(target={"kind": "example_append", "path": " out.db ", "table": "events"})
    target = workload.target
    assert isinstance(target, PluginTargetConfig)
    assert target.options() == {"path": " out.db ", "table": "events"}
    assert getattr(target, "table", "-") == "events"
    assert getattr(target, "lock_timeout_seconds", "-") == "-"


def test_settings_are_frozen_and_replace_checks_again() -> None:
    data = {**BASE, "target": {"kind": "rest", "url": "https://B.example.com/api/"}}
    del data["load"]  # a rest target's load is an append
    workload = parse_workload(data, base_dir=Path("/w"))
    target = workload.target
    assert isinstance(target, RestTargetConfig)
    assert target.url == "https://b.example.com/api"  # normalized once validated
    with pytest.raises(AttributeError):
        workload.release = "other"  # type: ignore[misc]
    moved = replace(target, url=None, url_env="RECEIVER")
    assert (moved.url, moved.url_env, target.url_env) == (None, "RECEIVER", None)
    with pytest.raises(ValueError, match="exactly one of url or url_env"):
        replace(target, url_env="RECEIVER")
    assert replace(workload, journal_env="J").journal_env == "J"


def test_to_json_dict_renders_json_types_and_leaves_out_base_dir() -> None:
    workload = _parse(incremental={"start": "2026-11-01T00:00:00Z"})
    rendered = to_json_dict(workload, exclude={"recovery"})
    assert "base_dir" not in rendered
    assert "recovery" not in rendered
    assert rendered["load"] == {
        "strategy": "append",
        "key": [],
        "interval_column": None,
        "batch_size": 10000,
    }
    assert rendered["incremental"]["start"] == "2026-11-01T00:00:00Z"
    assert rendered["lease_ttl_seconds"] == 60.0
    assert json.loads(json.dumps(rendered)) == rendered


def test_dpone_run_of_a_csv_to_sqlite_workload_never_imports_pydantic(tmp_path: Path) -> None:
    write_orders_csv(tmp_path / "orders.csv", 5)
    (tmp_path / "w.yaml").write_text(
        "workload: w\nrelease: r\ndeployment: d\njournal: sqlite:///j.db\n"
        "source: {kind: csv, path: orders.csv}\n"
        "target: {kind: sqlite, url: 'sqlite:///t.db', table: t}\n"
        "load: {strategy: append}\n",
        encoding="utf-8",
    )
    probe = (
        "import atexit, runpy, sys\n"
        "sys.argv = ['dpone', *sys.argv[1:]]\n"
        "heavy = ('pydantic', 'pydantic_core', 'annotated_types')\n"
        "atexit.register(lambda: print(\n"
        "    'loaded:', [m for m in heavy if m in sys.modules], 'msgspec' in sys.modules\n"
        "))\n"
        "runpy.run_module('dpone', run_name='__main__')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, "run", "w.yaml", "--interval", "2026-11-01/2026-11-02"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith("loaded: [] True"), done.stdout


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"load": {"strategy": "merge", "key": ["id"], "strategy ": "append"}}, "load.strategy "),
        ({"load": {"strategy\t": "append"}}, "load.strategy\t"),
        ({"target": {**BASE["target"], "kind ": "postgres"}}, "target.kind "),
        ({"target": {"kind": "sqlite", "url ": "sqlite:///t.db", "table": "t"}}, "target.url "),
        ({"target": {"kind": "sqlite", "url": "sqlite:///t.db", " table": "t"}}, "target. table"),
        ({"source": {"kind": "csv", "path ": "a.csv"}}, "source.path "),
    ],
)
def test_a_padded_field_name_is_an_unknown_field(changes: dict[str, Any], field: str) -> None:
    """Spaces are stripped from values, never from a field's name (a second strategy)."""
    error = _invalid(**changes)
    assert error.field == field, error.message
    assert "Extra inputs are not permitted" in error.message


def test_the_names_of_columns_and_source_hashes_are_stripped_and_must_stay_distinct() -> None:
    source = {"kind": "csv", "path": "{partition}.csv", "columns": {" id ": "integer"}}
    workload = _parse(source=source)
    assert workload.source.columns == {"id": "integer"}
    digest = "sha256:" + "0" * 64
    store = {"kind": "local", "path": "lake"}
    publication = {"dataset": "d", "store": store, "partitions": ["a"]}
    published = _parse(
        source=source,
        target={"kind": "publication"},
        load={"strategy": "replace"},
        publication={**publication, "source_hashes": {" a": digest}},
    )
    assert published.publication is not None
    assert published.publication.source_hashes == {"a": digest}
    error = _invalid(source={**source, "columns": {" id": "text", "id ": "integer"}})
    assert error.field == "source.columns", error.message
    assert "given twice" in error.message
    twice = {"source_hashes": {"a": digest, "a ": digest}}
    error = _invalid(
        source=source,
        target={"kind": "publication"},
        load={"strategy": "replace"},
        publication={**publication, **twice},
    )
    assert error.field == "publication.source_hashes", error.message


_CANARY = "postgresql://u:s3cretPW@h/db"
_PG = {"kind": "postgres", "url": "postgresql://h/db", "table": "t"}
_PUBLICATION = {
    "source": {"kind": "csv", "path": "{partition}.csv"},
    "target": {"kind": "publication"},
    "load": {"strategy": "replace"},
    "publication": {"dataset": "d", "store": {"kind": "local", "path": "l"}, "partitions": ["a"]},
}
#: mistakes with a pasted secret in them or beside them: the error never repeats it
SECRET_MISTAKES: list[dict[str, Any]] = [
    {"load": {"strategy": _CANARY}},
    {"load": {"strategy": "append", "key": [_CANARY]}},
    {"load": {"strategy": "append", _CANARY: 1}},
    {_CANARY: "append"},
    {f" {_CANARY} ": "append"},
    {"source": {"kind": "csv", "path": "a", "columns": {_CANARY: "text"}}},
    {"source": {"kind": "csv", "path": "a", "columns": {"a": _CANARY}}},
    {"source": {"kind": "csv", "path": "{" + _CANARY}},
    {"source": {"kind": "csv", "path": "{" + _CANARY + "}"}},
    {"source": {"kind": _CANARY, "path": "a"}},
    {"source": {"kind": {_CANARY: 1}, "path": "a"}},
    {"source": {"kind": "sqlite_table", "url": "sqlite:///s.db", "table": _CANARY}},
    {"source": {"kind": "sqlite_table", "url": "sqlite:///s.db", "table": "t", "x": _CANARY}},
    {"target": {**_PG, "table": _CANARY}},
    {"target": {**_PG, "fence_schema": _CANARY}},
    {"target": {**_PG, "url": _CANARY, "fence_schema": "1x"}},
    {"target": {"kind": _CANARY, "table": "t"}},
    {"target": {"kind": {_CANARY: "sqlite"}, "table": "t"}},
    {"target": {"kind": "rest", "url": _CANARY}},
    {"target": {"kind": "rest", "url": "https://h", "credential": _CANARY}},
    {"workload": _CANARY},
    {"journal_schema": _CANARY},
    {"audits": {"sql": [{"name": _CANARY, "query": "select 1"}]}},
    {"incremental": {"start": _CANARY}},
    {"retry": {"attempts": _CANARY}},
    {**_PUBLICATION, "publication": {**_PUBLICATION["publication"], "interval": _CANARY}},
    {**_PUBLICATION, "publication": {**_PUBLICATION["publication"], "format": _CANARY}},
    {**_PUBLICATION, "publication": {**_PUBLICATION["publication"], "store": {"kind": _CANARY}}},
    {**_PUBLICATION, "publication": {**_PUBLICATION["publication"], "partitions": [_CANARY]}},
]


@pytest.mark.parametrize("changes", SECRET_MISTAKES)
def test_a_mistake_never_repeats_a_value_of_the_file(changes: dict[str, Any]) -> None:
    error = _invalid(**changes)
    assert "s3cretPW" not in f"{error.message} {error.field} {error.hint}"


def test_dpone_run_never_prints_a_value_of_the_file(tmp_path: Path) -> None:
    """Through the CLI too, and for a variable name that is a pasted URL."""
    import yaml

    from dpone.testing.crash import run_dpone

    write_orders_csv(tmp_path / "orders.csv", 5)
    runs = [
        {"load": {"strategy": _CANARY}},
        {"target": {**_PG, "table": _CANARY}},
        {"target": {"kind": "sqlite", "url_env": _CANARY, "table": "t"}},
        {"journal_env": _CANARY},
    ]
    for n, changes in enumerate(runs):
        data = {**BASE, "source": {"kind": "csv", "path": "orders.csv"}, **changes}
        (tmp_path / f"w{n}.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
        done = run_dpone(["run", f"w{n}.yaml", "--interval", "2026-11-01/2026-11-02"], cwd=tmp_path)
        assert done.returncode == 2, (changes, done.stdout, done.stderr)
        assert "DPONE_CONFIG_INVALID" in done.stdout + done.stderr
        assert "s3cretPW" not in done.stdout + done.stderr, changes


def _laughs(depth: int) -> str:
    """YAML whose alias ``a{depth}`` expands to 10**depth values ("billion laughs")."""
    rows = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    rows += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, depth + 1)]
    return "\n  ".join(rows)


_HEAD_YAML = "workload: w\nrelease: r\ndeployment: d\nsource: {kind: csv, path: a.csv}\n"
_TARGET_YAML = "target: {kind: sqlite, url: 'sqlite:///t.db', table: t}\n"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (_HEAD_YAML + _TARGET_YAML + "load: {strategy: append}\njunk: &r [*r]\n", "junk"),
        (_HEAD_YAML + _TARGET_YAML + "load: {strategy: append}\njunk: &r {a: *r}\n", "junk"),
        (
            _HEAD_YAML + "target: &t {kind: sqlite, url: 'sqlite:///t.db', table: t, me: *t}\n",
            "target.me.me",
        ),
        (_HEAD_YAML + "target: &t {kind: example_append, me: *t}\n", "target.me.me"),
        (
            _HEAD_YAML + _TARGET_YAML + "load: {strategy: append}\n"
            "recovery: {authorized_principals: &p [a, *p]}\n",
            "recovery.authorized_principals.1",
        ),
        (
            "workload: w\nrelease: r\ndeployment: d\n"
            + _TARGET_YAML
            + "source: {kind: csv, path: a.csv, columns: &c {a: *c}}\n",
            "source.columns.a",
        ),
        (_HEAD_YAML + _TARGET_YAML + "junk: " + "[" * 5000 + "]" * 5000 + "\n", "workload"),
    ],
)
def test_a_value_inside_itself_is_a_config_error(tmp_path: Path, text: str, field: str) -> None:
    from dpone.config.workload import load_workload

    (tmp_path / "w.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(ConfigInvalid) as caught:
        load_workload(tmp_path / "w.yaml")
    assert caught.value.field == field, caught.value.message


@pytest.mark.parametrize("field", ["junk", "load.key"])
def test_repeated_aliases_are_refused_without_expanding_them(tmp_path: Path, field: str) -> None:
    """A depth-8 "billion laughs" (10**8 values) is refused in well under a second."""
    import time

    import yaml

    text = _HEAD_YAML + _TARGET_YAML + "load: {strategy: append}\njunk:\n  " + _laughs(8)
    data = yaml.safe_load(text)
    if field == "load.key":  # a known field: its values are read, up to a bound
        data["load"]["key"] = data.pop("junk")["a8"]
    started = time.process_time()
    with pytest.raises(ConfigInvalid) as caught:
        parse_workload(data, base_dir=tmp_path)
    assert time.process_time() - started < 1.0
    assert caught.value.field.startswith(field), caught.value.message


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"release": "\ud800"}, "release"),
        ({"source": {"kind": "csv", "path": "a\udfff.csv"}}, "source.path"),
        ({"target": {"kind": "sqlite", "url": "sqlite:///\ud800.db", "table": "t"}}, "target.url"),
        ({"target": {"kind": "sqlite", "url_env": "\ud800", "table": "t"}}, "target.url_env"),
        ({"target": {"kind": "example_append", "path": "\ud800"}}, "target.path"),
        ({"source": {"kind": "csv", "path": "a", "columns": {"\ud800": "text"}}}, "source.columns"),
    ],
)
def test_text_utf8_cannot_encode_is_refused(changes: dict[str, Any], field: str) -> None:
    """A lone surrogate would fail later, in the identity digest (canonical_json)."""
    error = _invalid(**changes)
    assert error.field == field, error.message
    assert "lone surrogate" in error.message
    error.message.encode("utf-8")


def test_replace_checks_the_class_of_a_section_against_its_kind() -> None:
    workload = _parse()
    assert replace(workload, source=workload.source).source is workload.source
    with pytest.raises(ValueError, match="source kind's section, got a SqliteTargetConfig"):
        replace(workload, source=workload.target)
    with pytest.raises(ValueError, match="target kind's section, got a CsvSourceConfig"):
        replace(workload, target=workload.source)
    with pytest.raises(ValueError, match="target kind's section"):
        replace(workload, target=PluginTargetConfig(kind="sqlite"))
    plugin = PluginTargetConfig(kind="example_append", extra={"path": "o"})
    assert replace(workload, target=plugin).target is plugin
    publication = _parse(
        source={"kind": "csv", "path": "{partition}.csv"},
        target={"kind": "publication"},
        load={"strategy": "replace"},
        publication={"dataset": "d", "store": {"kind": "local", "path": "l"}, "partitions": ["a"]},
    ).publication
    assert publication is not None
    with pytest.raises(ValueError, match="store kind's section"):
        replace(publication, store=workload.target)


def test_a_padded_rest_kind_still_appends_by_default() -> None:
    data = {**BASE, "target": {"kind": " rest ", "url": "https://h/api"}}
    del data["load"]
    workload = parse_workload(data, base_dir=Path("/w"))
    assert (workload.target.kind, workload.load.strategy) == ("rest", "append")


@pytest.mark.parametrize(
    "start", ["9999-12-31T23:00:00-05:00", "0001-01-01T01:00:00+05:00", "9999-12-31 23:00-05"]
)
def test_a_start_outside_the_utc_calendar_is_a_config_error(start: str) -> None:
    error = _invalid(incremental={"start": start})
    assert error.field == "incremental.start", error.message
    assert "years 1 to 9999" in error.message


def test_a_yaml_set_is_refused_its_order_varies_by_run() -> None:
    """``key: !!set {a, b}`` would put the key columns in the pack in hash order."""
    error = _invalid(load={"strategy": "merge", "key": {"a", "b"}})
    assert error.field == "load.key", error.message
    assert "!!set" in error.message


def test_a_store_variable_that_is_a_pasted_secret_is_not_repeated() -> None:
    from dpone.config.publication import open_store
    from dpone.config.workload import S3StoreConfig

    store = S3StoreConfig(
        kind="s3", bucket="lake", access_key_id_env="KEY", secret_access_key_env=_CANARY
    )
    with pytest.raises(ConfigInvalid) as caught:
        open_store(store, base_dir=Path("/w"), environ={"KEY": "k"})
    assert caught.value.field == "publication.store.secret_access_key_env"
    assert "s3cretPW" not in f"{caught.value.message} {caught.value.hint}"
    with pytest.raises(ConfigInvalid, match="access_key_id_env names KEY, which is not set"):
        open_store(store, base_dir=Path("/w"), environ={})
