"""url / url_env resolution of SQL sources and targets: the value, or a clear error."""

from pathlib import Path

import pytest

from dpone.config.workload import parse_workload
from dpone.errors import ConfigInvalid


def _workload(tmp_path: Path) -> object:
    return parse_workload(
        {
            "workload": "w",
            "release": "r",
            "deployment": "d",
            "source": {"kind": "postgres_table", "url_env": "SRC_URL", "table": "orders"},
            "target": {"kind": "postgres", "url_env": "TGT_URL", "table": "orders"},
            "load": {"strategy": "append"},
        },
        base_dir=tmp_path,
    )


def test_url_env_values_are_read_from_the_given_environment(tmp_path: Path) -> None:
    workload = _workload(tmp_path)
    env = {"SRC_URL": "postgresql://src/db", "TGT_URL": "postgresql://tgt/db"}
    assert workload.source_url(env) == "postgresql://src/db"  # type: ignore[attr-defined]
    assert workload.target_url(env) == "postgresql://tgt/db"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("method", "section", "name"),
    [("source_url", "source", "SRC_URL"), ("target_url", "target", "TGT_URL")],
)
def test_an_unset_url_env_names_the_variable(
    tmp_path: Path, method: str, section: str, name: str
) -> None:
    workload = _workload(tmp_path)
    with pytest.raises(ConfigInvalid) as caught:
        getattr(workload, method)({})
    assert caught.value.field == f"{section}.url_env"
    assert name in str(caught.value)
    assert f"export {name}=" in (caught.value.hint or "")
