"""Operation identity does not depend on how workload files are validated.

The pack fingerprint (and so every operation's intent) digests a JSON rendering of the
validated ``source`` and ``load`` sections, and a publication's intent its ``publication``
section. The literals below were computed by the pydantic-based validator (before ADR
0010); any change of key, default, enum or number rendering changes them, and with them
the identity of every journalled operation, so they must never be updated casually.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dpone.config.bootstrap import RunContext, _pack_fields, pack_fingerprint, workload_operation_id
from dpone.config.publication import _publication_fields
from dpone.config.workload import parse_workload
from dpone.contracts.identity import parse_interval

_HEAD = {"workload": "orders", "release": "2026.11.0", "deployment": "dev"}
_SQLITE = {"kind": "sqlite", "url": "sqlite:///warehouse.db", "table": "orders"}

CASES: dict[str, dict[str, Any]] = {
    # the README's example
    "readme_csv_sqlite": {
        **_HEAD,
        "journal": "sqlite:///.dpone/journal.db",
        "lease_ttl_seconds": 60,
        "source": {"kind": "csv", "path": "data/orders.csv"},
        "target": _SQLITE,
        "load": {"strategy": "append", "key": ["order_id"], "interval_column": "ordered_at"},
        "recovery": {"authorized_principals": ["alice"]},
    },
    "csv_columns_postgres_merge": {
        **_HEAD,
        "source": {
            "kind": "csv",
            "path": "in/{start:%Y-%m-%d}.csv",
            "delimiter": ";",
            "columns": {"id": "integer", "amount": "real", "at": "timestamp", "ok": "boolean"},
        },
        "target": {
            "kind": "postgres",
            "url_env": "WH",
            "table": "analytics.orders",
            "lock_timeout_seconds": 5,
        },
        "load": {"strategy": "merge", "key": ["id"], "batch_size": 500},
        "audits": {"min_rows": 1, "not_null": ["id"], "unique_key": ["id"]},
        "retry": {"attempts": 3, "budget_seconds": 30},
    },
    "jsonl_duckdb_replace": {
        **_HEAD,
        "source": {"kind": "jsonl", "path": "events.jsonl", "columns": {"e": "text"}},
        "target": {"kind": "duckdb", "url": "duckdb:///w.duckdb", "table": "events"},
        "load": {"strategy": "replace"},
    },
    "parquet_mariadb_replace_interval": {
        **_HEAD,
        "source": {"kind": "parquet", "path": "p/{partition}.parquet"},
        "target": {"kind": "mariadb", "url_env": "MDB", "table": "w.t", "fence_schema": "f"},
        "load": {"strategy": "replace_interval", "interval_column": "day"},
    },
    "postgres_table_mysql_incremental": {
        **_HEAD,
        "source": {
            "kind": "postgres_table",
            "url_env": "SRC",
            "table": "app.orders",
            "cursor_column": "changed_at",
            "columns": {"id": "integer"},
        },
        "target": {"kind": "mysql", "url": "mysql://u@h/db", "table": "orders"},
        "load": {"strategy": "append"},
        "incremental": {"start": "2026-11-01T00:00:00Z", "lag_seconds": 300},
    },
    "mariadb_table_jsonl_append": {
        **_HEAD,
        "source": {"kind": "mariadb_table", "url": "mysql://h/db", "table": "orders"},
        "target": {"kind": "jsonl_append", "path": "out.jsonl"},
        "load": {"strategy": "append"},
    },
    "sqlite_table_rest": {
        **_HEAD,
        "source": {"kind": "sqlite_table", "url": "sqlite:///src.db", "table": "main.orders"},
        "target": {
            "kind": "rest",
            "url": "https://Bulk.Example.com/api/",
            "credential": "env:TOKEN",
            "capacity": 3,
            "rows_per_child": 1000,
        },
        "incremental": {"start": "2026-11-01", "max_interval_seconds": 86400},
    },
    # surrounding spaces are stripped from every string field before it is used
    "whitespace_is_stripped": {
        **_HEAD,
        "source": {"kind": "sqlite_table", "url": "sqlite:///s.db", "table": " orders "},
        "target": _SQLITE,
        "load": {"strategy": "merge", "key": [" id "]},
    },
    # a third-party connector's target (examples/dpone-example-connector): its options go
    # to the connector as written, unstripped, and only its kind is in the pack
    "csv_plugin_replace_interval": {
        **_HEAD,
        "source": {
            "kind": "csv",
            "path": " in/{partition}.csv ",
            "columns": {" id ": "integer", "at": "timestamp"},
        },
        "target": {"kind": "example_append", "path": " out.jsonl ", "n": 2},
        "load": {"strategy": "replace_interval", "interval_column": " at "},
    },
}

PUBLICATIONS: dict[str, dict[str, Any]] = {
    "local_partitions": {
        **_HEAD,
        "source": {"kind": "csv", "path": "t/{partition}.csv"},
        "publication": {
            "dataset": "tenants",
            "store": {"kind": "local", "path": "lake"},
            "partitions": ["t1", "t2"],
            "source_hashes": {"t1": "sha256:" + "a" * 64},
        },
    },
    "s3_from_source": {
        **_HEAD,
        "source": {"kind": "jsonl", "path": "t/{partition}.jsonl"},
        "publication": {
            "dataset": "tenants",
            "interval": "2026-11-01/2026-11-02",
            "store": {
                "kind": "s3",
                "bucket": "lake",
                "endpoint_env": "S3_URL",
                "access_key_id_env": "K",
                "secret_access_key_env": "S",
            },
            "format": "csv",
            "partitions_from_source": True,
            "audits": {"min_rows": 2},
            "retention_hours": 24,
        },
    },
}

EXPECTED_PACK_FIELDS: dict[str, dict[str, object]] = {
    "csv_plugin_replace_interval": {
        "workload": "orders",
        "release": "2026.11.0",
        "deployment": "dev",
        "source": {
            "columns": {"id": "integer", "at": "timestamp"},
            "kind": "csv",
            "delimiter": ",",
        },
        "target": {"kind": "example_append", "identity": "sqlite:/warehouse.db#main.orders"},
        "load": {"strategy": "replace_interval", "key": [], "interval_column": "at"},
    },
    "csv_columns_postgres_merge": {
        "workload": "orders",
        "release": "2026.11.0",
        "deployment": "dev",
        "source": {
            "columns": {"id": "integer", "amount": "real", "at": "timestamp", "ok": "boolean"},
            "kind": "csv",
            "delimiter": ";",
        },
        "target": {"kind": "postgres", "identity": "sqlite:/warehouse.db#main.orders"},
        "load": {"strategy": "merge", "key": ["id"], "interval_column": None},
    },
    "jsonl_duckdb_replace": {
        "workload": "orders",
        "release": "2026.11.0",
        "deployment": "dev",
        "source": {"columns": {"e": "text"}, "kind": "jsonl"},
        "target": {"kind": "duckdb", "identity": "sqlite:/warehouse.db#main.orders"},
        "load": {"strategy": "replace", "key": [], "interval_column": None},
    },
    "mariadb_table_jsonl_append": {
        "workload": "orders",
        "release": "2026.11.0",
        "deployment": "dev",
        "source": {
            "table": "orders",
            "cursor_column": "updated_at",
            "columns": None,
            "kind": "mariadb_table",
        },
        "target": {"kind": "jsonl_append", "identity": "sqlite:/warehouse.db#main.orders"},
        "load": {"strategy": "append", "key": [], "interval_column": None},
    },
    "parquet_mariadb_replace_interval": {
        "workload": "orders",
        "release": "2026.11.0",
        "deployment": "dev",
        "source": {"columns": None, "kind": "parquet"},
        "target": {"kind": "mariadb", "identity": "sqlite:/warehouse.db#main.orders"},
        "load": {"strategy": "replace_interval", "key": [], "interval_column": "day"},
    },
    "postgres_table_mysql_incremental": {
        "workload": "orders",
        "release": "2026.11.0",
        "deployment": "dev",
        "source": {
            "table": "app.orders",
            "cursor_column": "changed_at",
            "columns": {"id": "integer"},
            "kind": "postgres_table",
        },
        "target": {"kind": "mysql", "identity": "sqlite:/warehouse.db#main.orders"},
        "load": {"strategy": "append", "key": [], "interval_column": None},
    },
    "readme_csv_sqlite": {
        "workload": "orders",
        "release": "2026.11.0",
        "deployment": "dev",
        "source": {"columns": None, "kind": "csv", "delimiter": ","},
        "target": {"kind": "sqlite", "identity": "sqlite:/warehouse.db#main.orders"},
        "load": {"strategy": "append", "key": ["order_id"], "interval_column": "ordered_at"},
    },
    "sqlite_table_rest": {
        "workload": "orders",
        "release": "2026.11.0",
        "deployment": "dev",
        "source": {
            "table": "main.orders",
            "cursor_column": "updated_at",
            "columns": None,
            "kind": "sqlite_table",
        },
        "target": {"kind": "rest", "identity": "sqlite:/warehouse.db#main.orders"},
        "load": {"strategy": "append", "key": [], "interval_column": None},
    },
    "whitespace_is_stripped": {
        "workload": "orders",
        "release": "2026.11.0",
        "deployment": "dev",
        "source": {
            "table": "orders",
            "cursor_column": "updated_at",
            "columns": None,
            "kind": "sqlite_table",
        },
        "target": {"kind": "sqlite", "identity": "sqlite:/warehouse.db#main.orders"},
        "load": {"strategy": "merge", "key": ["id"], "interval_column": None},
    },
}
EXPECTED_PACK: dict[str, str] = {
    "csv_plugin_replace_interval": (
        "sha256:2865e001ae4ff4064d94da603d01361107501b6c4dacbc4bc631f7a955a46376"
    ),
    "csv_columns_postgres_merge": (
        "sha256:7d7b45abf60413e38696e5dd56d4886e753cb7193ec30f6ed66fbdf65c13153d"
    ),
    "jsonl_duckdb_replace": (
        "sha256:b8e4a9936f8dd2600f40e7e26767d6e663e976b8257cccc17902e8bbf66ddcb8"
    ),
    "mariadb_table_jsonl_append": (
        "sha256:1c15d9eae0fdb69113c3bcf221b308e3ac03eb593bd25304df3d0a0d9c026189"
    ),
    "parquet_mariadb_replace_interval": (
        "sha256:21b1d80269a255e350687e8de7f488a77d75dc45d13257c1647a1937f32a6aa9"
    ),
    "postgres_table_mysql_incremental": (
        "sha256:04d26063a5bda5e926aa883d62b8ad2d3a981afdb702d7c159ebc7146d91a051"
    ),
    "readme_csv_sqlite": (
        "sha256:77eaebe92a3ac643a3b0c6e7e82cb3caaaeda4f7c8855fad353e6a15eda3f5d1"
    ),
    "sqlite_table_rest": (
        "sha256:a70d42dc73b48f70e6b2c6759112a8cc1c3b87337342f72db5ff65bc87878d7c"
    ),
    "whitespace_is_stripped": (
        "sha256:3513f28fca9d4d8465be49e3e876fd3deb4bca744e67769f5f3e1ac5f0d52335"
    ),
    "publication_local_partitions": (
        "sha256:530e4624da343140aecde22d68f610f2176f846ad49b0b95d2aa57db34b710bb"
    ),
    "publication_s3_from_source": (
        "sha256:5c2eb2e95803364a23be8881c6525b5250c10e270bc3cfd66b526f59106e3c9f"
    ),
}
#: the operation id depends on workload, release and deployment only (all cases share them)
EXPECTED_OPERATION = "sha256:286acb3e7821b2dcd954abb71fd72def00ecec0d28dd289c6b8ae6bb7944f9f7"
EXPECTED_PUBLICATION_FIELDS: dict[str, dict[str, object]] = {
    "local_partitions": {
        "dataset": "tenants",
        "store": {"kind": "local", "path": "lake"},
        "format": "parquet",
        "partitions": ["t1", "t2"],
        "partitions_from_source": False,
        "source_hashes": {
            "t1": "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
        },
    },
    "s3_from_source": {
        "dataset": "tenants",
        "store": {
            "kind": "s3",
            "bucket": "lake",
            "prefix": "",
            "endpoint": None,
            "endpoint_env": "S3_URL",
            "region": "us-east-1",
            "access_key_id_env": "K",
            "secret_access_key_env": "S",
        },
        "format": "csv",
        "partitions": None,
        "partitions_from_source": True,
        "source_hashes": None,
    },
}
EXPECTED_VALUES: dict[str, object] = {
    "csv_plugin_replace_interval": {
        "workload": "'orders'",
        "release": "'2026.11.0'",
        "deployment": "'dev'",
        "journal": "None",
        "journal_env": "None",
        "journal_schema": "'dpone'",
        "lease_ttl_seconds": "60.0",
        "source": {
            "path": "'in/{partition}.csv'",
            "columns": {
                "id": "<ColumnType.INTEGER: 'integer'>",
                "at": "<ColumnType.TIMESTAMP: 'timestamp'>",
            },
            "kind": "'csv'",
            "delimiter": "','",
        },
        # pydantic kept the options as the model's extras (model_extra), the same values
        "target": {"kind": "'example_append'", "extra": {"path": "' out.jsonl '", "n": "2"}},
        "load": {
            "strategy": "<LoadStrategy.REPLACE_INTERVAL: 'replace_interval'>",
            "key": [],
            "interval_column": "'at'",
            "batch_size": "10000",
        },
        "recovery": {"authorized_principals": []},
        "incremental": "None",
        "audits": "None",
        "retry": {
            "attempts": "1",
            "budget_seconds": "60.0",
            "wait_initial_seconds": "0.5",
            "wait_max_seconds": "10.0",
            "wait_jitter_seconds": "0.5",
            "wait_exp_base": "2.0",
        },
        "require_certified": "False",
        "certification_dir": "None",
        "publication": "None",
        "base_dir": "PosixPath('/w')",
    },
    "csv_columns_postgres_merge": {
        "workload": "'orders'",
        "release": "'2026.11.0'",
        "deployment": "'dev'",
        "journal": "None",
        "journal_env": "None",
        "journal_schema": "'dpone'",
        "lease_ttl_seconds": "60.0",
        "source": {
            "path": "'in/{start:%Y-%m-%d}.csv'",
            "columns": {
                "id": "<ColumnType.INTEGER: 'integer'>",
                "amount": "<ColumnType.REAL: 'real'>",
                "at": "<ColumnType.TIMESTAMP: 'timestamp'>",
                "ok": "<ColumnType.BOOLEAN: 'boolean'>",
            },
            "kind": "'csv'",
            "delimiter": "';'",
        },
        "target": {
            "kind": "'postgres'",
            "url": "None",
            "url_env": "'WH'",
            "table": "'analytics.orders'",
            "fence_schema": "'dpone'",
            "lock_timeout_seconds": "5.0",
        },
        "load": {
            "strategy": "<LoadStrategy.MERGE: 'merge'>",
            "key": ["'id'"],
            "interval_column": "None",
            "batch_size": "500",
        },
        "recovery": {"authorized_principals": []},
        "incremental": "None",
        "audits": {
            "min_rows": "1",
            "max_rows": "None",
            "not_null": ["'id'"],
            "unique_key": ["'id'"],
            "sql": [],
        },
        "retry": {
            "attempts": "3",
            "budget_seconds": "30.0",
            "wait_initial_seconds": "0.5",
            "wait_max_seconds": "10.0",
            "wait_jitter_seconds": "0.5",
            "wait_exp_base": "2.0",
        },
        "require_certified": "False",
        "certification_dir": "None",
        "publication": "None",
        "base_dir": "PosixPath('/w')",
    },
    "jsonl_duckdb_replace": {
        "workload": "'orders'",
        "release": "'2026.11.0'",
        "deployment": "'dev'",
        "journal": "None",
        "journal_env": "None",
        "journal_schema": "'dpone'",
        "lease_ttl_seconds": "60.0",
        "source": {
            "path": "'events.jsonl'",
            "columns": {"e": "<ColumnType.TEXT: 'text'>"},
            "kind": "'jsonl'",
        },
        "target": {
            "url": "'duckdb:///w.duckdb'",
            "url_env": "None",
            "table": "'events'",
            "lock_timeout_seconds": "10.0",
            "kind": "'duckdb'",
        },
        "load": {
            "strategy": "<LoadStrategy.REPLACE: 'replace'>",
            "key": [],
            "interval_column": "None",
            "batch_size": "10000",
        },
        "recovery": {"authorized_principals": []},
        "incremental": "None",
        "audits": "None",
        "retry": {
            "attempts": "1",
            "budget_seconds": "60.0",
            "wait_initial_seconds": "0.5",
            "wait_max_seconds": "10.0",
            "wait_jitter_seconds": "0.5",
            "wait_exp_base": "2.0",
        },
        "require_certified": "False",
        "certification_dir": "None",
        "publication": "None",
        "base_dir": "PosixPath('/w')",
    },
    "mariadb_table_jsonl_append": {
        "workload": "'orders'",
        "release": "'2026.11.0'",
        "deployment": "'dev'",
        "journal": "None",
        "journal_env": "None",
        "journal_schema": "'dpone'",
        "lease_ttl_seconds": "60.0",
        "source": {
            "url": "'mysql://h/db'",
            "url_env": "None",
            "table": "'orders'",
            "cursor_column": "'updated_at'",
            "columns": "None",
            "kind": "'mariadb_table'",
        },
        "target": {"kind": "'jsonl_append'", "path": "'out.jsonl'"},
        "load": {
            "strategy": "<LoadStrategy.APPEND: 'append'>",
            "key": [],
            "interval_column": "None",
            "batch_size": "10000",
        },
        "recovery": {"authorized_principals": []},
        "incremental": "None",
        "audits": "None",
        "retry": {
            "attempts": "1",
            "budget_seconds": "60.0",
            "wait_initial_seconds": "0.5",
            "wait_max_seconds": "10.0",
            "wait_jitter_seconds": "0.5",
            "wait_exp_base": "2.0",
        },
        "require_certified": "False",
        "certification_dir": "None",
        "publication": "None",
        "base_dir": "PosixPath('/w')",
    },
    "parquet_mariadb_replace_interval": {
        "workload": "'orders'",
        "release": "'2026.11.0'",
        "deployment": "'dev'",
        "journal": "None",
        "journal_env": "None",
        "journal_schema": "'dpone'",
        "lease_ttl_seconds": "60.0",
        "source": {"path": "'p/{partition}.parquet'", "columns": "None", "kind": "'parquet'"},
        "target": {
            "url": "None",
            "url_env": "'MDB'",
            "table": "'w.t'",
            "lock_timeout_seconds": "10.0",
            "kind": "'mariadb'",
            "fence_schema": "'f'",
        },
        "load": {
            "strategy": "<LoadStrategy.REPLACE_INTERVAL: 'replace_interval'>",
            "key": [],
            "interval_column": "'day'",
            "batch_size": "10000",
        },
        "recovery": {"authorized_principals": []},
        "incremental": "None",
        "audits": "None",
        "retry": {
            "attempts": "1",
            "budget_seconds": "60.0",
            "wait_initial_seconds": "0.5",
            "wait_max_seconds": "10.0",
            "wait_jitter_seconds": "0.5",
            "wait_exp_base": "2.0",
        },
        "require_certified": "False",
        "certification_dir": "None",
        "publication": "None",
        "base_dir": "PosixPath('/w')",
    },
    "postgres_table_mysql_incremental": {
        "workload": "'orders'",
        "release": "'2026.11.0'",
        "deployment": "'dev'",
        "journal": "None",
        "journal_env": "None",
        "journal_schema": "'dpone'",
        "lease_ttl_seconds": "60.0",
        "source": {
            "url": "None",
            "url_env": "'SRC'",
            "table": "'app.orders'",
            "cursor_column": "'changed_at'",
            "columns": {"id": "<ColumnType.INTEGER: 'integer'>"},
            "kind": "'postgres_table'",
        },
        "target": {
            "url": "'mysql://u@h/db'",
            "url_env": "None",
            "table": "'orders'",
            "lock_timeout_seconds": "10.0",
            "kind": "'mysql'",
            "fence_schema": "None",
        },
        "load": {
            "strategy": "<LoadStrategy.APPEND: 'append'>",
            "key": [],
            "interval_column": "None",
            "batch_size": "10000",
        },
        "recovery": {"authorized_principals": []},
        "incremental": {
            "start": "datetime.datetime(2026, 11, 1, 0, 0, tzinfo=datetime.timezone.utc)",
            "lag_seconds": "300.0",
            "max_interval_seconds": "None",
        },
        "audits": "None",
        "retry": {
            "attempts": "1",
            "budget_seconds": "60.0",
            "wait_initial_seconds": "0.5",
            "wait_max_seconds": "10.0",
            "wait_jitter_seconds": "0.5",
            "wait_exp_base": "2.0",
        },
        "require_certified": "False",
        "certification_dir": "None",
        "publication": "None",
        "base_dir": "PosixPath('/w')",
    },
    "readme_csv_sqlite": {
        "workload": "'orders'",
        "release": "'2026.11.0'",
        "deployment": "'dev'",
        "journal": "'sqlite:///.dpone/journal.db'",
        "journal_env": "None",
        "journal_schema": "'dpone'",
        "lease_ttl_seconds": "60.0",
        "source": {
            "path": "'data/orders.csv'",
            "columns": "None",
            "kind": "'csv'",
            "delimiter": "','",
        },
        "target": {
            "kind": "'sqlite'",
            "url": "'sqlite:///warehouse.db'",
            "url_env": "None",
            "table": "'orders'",
        },
        "load": {
            "strategy": "<LoadStrategy.APPEND: 'append'>",
            "key": ["'order_id'"],
            "interval_column": "'ordered_at'",
            "batch_size": "10000",
        },
        "recovery": {"authorized_principals": ["'alice'"]},
        "incremental": "None",
        "audits": "None",
        "retry": {
            "attempts": "1",
            "budget_seconds": "60.0",
            "wait_initial_seconds": "0.5",
            "wait_max_seconds": "10.0",
            "wait_jitter_seconds": "0.5",
            "wait_exp_base": "2.0",
        },
        "require_certified": "False",
        "certification_dir": "None",
        "publication": "None",
        "base_dir": "PosixPath('/w')",
    },
    "sqlite_table_rest": {
        "workload": "'orders'",
        "release": "'2026.11.0'",
        "deployment": "'dev'",
        "journal": "None",
        "journal_env": "None",
        "journal_schema": "'dpone'",
        "lease_ttl_seconds": "60.0",
        "source": {
            "url": "'sqlite:///src.db'",
            "url_env": "None",
            "table": "'main.orders'",
            "cursor_column": "'updated_at'",
            "columns": "None",
            "kind": "'sqlite_table'",
        },
        "target": {
            "kind": "'rest'",
            "url": "'https://bulk.example.com/api'",
            "url_env": "None",
            "credential": "'env:TOKEN'",
            "capacity": "3",
            "rows_per_child": "1000",
            "chunk_bytes": "1048576",
            "poll_interval_seconds": "5.0",
            "wait_budget_seconds": "30.0",
            "request_timeout_seconds": "10.0",
            "submit_lease_seconds": "60.0",
            "staging_dir": "'.dpone/staging'",
        },
        "load": {
            "strategy": "<LoadStrategy.APPEND: 'append'>",
            "key": [],
            "interval_column": "None",
            "batch_size": "10000",
        },
        "recovery": {"authorized_principals": []},
        "incremental": {
            "start": "datetime.datetime(2026, 11, 1, 0, 0, tzinfo=datetime.timezone.utc)",
            "lag_seconds": "0.0",
            "max_interval_seconds": "86400.0",
        },
        "audits": "None",
        "retry": {
            "attempts": "1",
            "budget_seconds": "60.0",
            "wait_initial_seconds": "0.5",
            "wait_max_seconds": "10.0",
            "wait_jitter_seconds": "0.5",
            "wait_exp_base": "2.0",
        },
        "require_certified": "False",
        "certification_dir": "None",
        "publication": "None",
        "base_dir": "PosixPath('/w')",
    },
    "whitespace_is_stripped": {
        "workload": "'orders'",
        "release": "'2026.11.0'",
        "deployment": "'dev'",
        "journal": "None",
        "journal_env": "None",
        "journal_schema": "'dpone'",
        "lease_ttl_seconds": "60.0",
        "source": {
            "url": "'sqlite:///s.db'",
            "url_env": "None",
            "table": "'orders'",
            "cursor_column": "'updated_at'",
            "columns": "None",
            "kind": "'sqlite_table'",
        },
        "target": {
            "kind": "'sqlite'",
            "url": "'sqlite:///warehouse.db'",
            "url_env": "None",
            "table": "'orders'",
        },
        "load": {
            "strategy": "<LoadStrategy.MERGE: 'merge'>",
            "key": ["'id'"],
            "interval_column": "None",
            "batch_size": "10000",
        },
        "recovery": {"authorized_principals": []},
        "incremental": "None",
        "audits": "None",
        "retry": {
            "attempts": "1",
            "budget_seconds": "60.0",
            "wait_initial_seconds": "0.5",
            "wait_max_seconds": "10.0",
            "wait_jitter_seconds": "0.5",
            "wait_exp_base": "2.0",
        },
        "require_certified": "False",
        "certification_dir": "None",
        "publication": "None",
        "base_dir": "PosixPath('/w')",
    },
    "local_partitions": {
        "workload": "'orders'",
        "release": "'2026.11.0'",
        "deployment": "'dev'",
        "journal": "None",
        "journal_env": "None",
        "journal_schema": "'dpone'",
        "lease_ttl_seconds": "60.0",
        "source": {
            "path": "'t/{partition}.csv'",
            "columns": "None",
            "kind": "'csv'",
            "delimiter": "','",
        },
        "target": {"kind": "'publication'"},
        "load": {
            "strategy": "<LoadStrategy.REPLACE: 'replace'>",
            "key": [],
            "interval_column": "None",
            "batch_size": "10000",
        },
        "recovery": {"authorized_principals": []},
        "incremental": "None",
        "audits": "None",
        "retry": {
            "attempts": "1",
            "budget_seconds": "60.0",
            "wait_initial_seconds": "0.5",
            "wait_max_seconds": "10.0",
            "wait_jitter_seconds": "0.5",
            "wait_exp_base": "2.0",
        },
        "require_certified": "False",
        "certification_dir": "None",
        "publication": {
            "dataset": "'tenants'",
            "interval": "None",
            "store": {"kind": "'local'", "path": "'lake'"},
            "format": "'parquet'",
            "partitions": ["'t1'", "'t2'"],
            "partitions_from_source": "False",
            "audits": {"min_rows": "0", "not_null": []},
            "retention_hours": "168.0",
            "source_hashes": {
                "t1": "'sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'"
            },
        },
        "base_dir": "PosixPath('/w')",
    },
    "s3_from_source": {
        "workload": "'orders'",
        "release": "'2026.11.0'",
        "deployment": "'dev'",
        "journal": "None",
        "journal_env": "None",
        "journal_schema": "'dpone'",
        "lease_ttl_seconds": "60.0",
        "source": {"path": "'t/{partition}.jsonl'", "columns": "None", "kind": "'jsonl'"},
        "target": {"kind": "'publication'"},
        "load": {
            "strategy": "<LoadStrategy.REPLACE: 'replace'>",
            "key": [],
            "interval_column": "None",
            "batch_size": "10000",
        },
        "recovery": {"authorized_principals": []},
        "incremental": "None",
        "audits": "None",
        "retry": {
            "attempts": "1",
            "budget_seconds": "60.0",
            "wait_initial_seconds": "0.5",
            "wait_max_seconds": "10.0",
            "wait_jitter_seconds": "0.5",
            "wait_exp_base": "2.0",
        },
        "require_certified": "False",
        "certification_dir": "None",
        "publication": {
            "dataset": "'tenants'",
            "interval": "'2026-11-01T00:00:00Z/2026-11-02T00:00:00Z'",
            "store": {
                "kind": "'s3'",
                "bucket": "'lake'",
                "prefix": "''",
                "endpoint": "None",
                "endpoint_env": "'S3_URL'",
                "region": "'us-east-1'",
                "access_key_id_env": "'K'",
                "secret_access_key_env": "'S'",
            },
            "format": "'csv'",
            "partitions": "None",
            "partitions_from_source": "True",
            "audits": {"min_rows": "2", "not_null": []},
            "retention_hours": "24.0",
            "source_hashes": "None",
        },
        "base_dir": "PosixPath('/w')",
    },
}

_INTERVAL = parse_interval("2026-11-01/2026-11-02")
_TARGET_IDENTITY = "sqlite:/warehouse.db#main.orders"


@pytest.mark.parametrize("name", sorted(CASES))
def test_pack_fingerprints_are_pinned(name: str) -> None:
    workload = parse_workload(CASES[name], base_dir=Path("/w"))
    assert _pack_fields(workload, _TARGET_IDENTITY) == EXPECTED_PACK_FIELDS[name]
    assert pack_fingerprint(workload, _TARGET_IDENTITY) == EXPECTED_PACK[name]
    operation = workload_operation_id(
        workload, RunContext(), partition=None, window=_INTERVAL, target_identity=_TARGET_IDENTITY
    )
    assert operation == EXPECTED_OPERATION


@pytest.mark.parametrize("name", sorted(PUBLICATIONS))
def test_publication_intents_are_pinned(name: str) -> None:
    workload = parse_workload(PUBLICATIONS[name], base_dir=Path("/w"))
    assert workload.publication is not None
    assert _publication_fields(workload.publication) == EXPECTED_PUBLICATION_FIELDS[name]
    assert pack_fingerprint(workload, "store") == EXPECTED_PACK[f"publication_{name}"]


def _plain(value: object) -> object:
    """Every validated field as ``repr`` of its leaf value: types and renderings included."""
    names = getattr(value, "__struct_fields__", ())  # (pydantic's model_fields before ADR 0010)
    if names:
        return {name: _plain(getattr(value, name)) for name in names}
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return repr(value)


@pytest.mark.parametrize("name", sorted(CASES) + sorted(PUBLICATIONS))
def test_validated_values_are_pinned(name: str) -> None:
    """Defaults, float vs int, UTC datetimes, enums: what the rest of dpone reads."""
    data = CASES.get(name) or PUBLICATIONS[name]
    assert _plain(parse_workload(data, base_dir=Path("/w"))) == EXPECTED_VALUES[name]
