"""Checks every SQL connector applies to a load plan before touching its target."""

from __future__ import annotations

from dpone.contracts.load import LoadPlan, LoadStrategy, is_identifier
from dpone.errors import ConfigInvalid

__all__ = ["check_plan_shape"]


def check_plan_shape(plan: LoadPlan) -> set[str]:
    """Refuse a plan whose columns, key or interval column cannot be written safely.

    Returns the lower-cased column names.

    Raises:
        ConfigInvalid: no columns, a column that is not a plain identifier or appears
            twice, a merge without a key among the columns, or a replace_interval without
            an interval and an interval column among the columns.
    """
    if not plan.columns:
        raise ConfigInvalid("the load plan has no columns", field="columns")
    seen: set[str] = set()
    for index, column in enumerate(plan.columns, start=1):
        if not is_identifier(column.name):
            raise ConfigInvalid(
                f"column #{index} does not have a plain identifier as its name",
                field="columns",
                hint="rename the column to [A-Za-z_][A-Za-z0-9_]*",
            )
        if column.name.lower() in seen:
            raise ConfigInvalid(f"column {column.name!r} appears twice", field="columns")
        seen.add(column.name.lower())
    if plan.strategy is LoadStrategy.MERGE:
        if not plan.key:
            raise ConfigInvalid("merge needs a key", field="key", hint="set key: [id]")
        missing = [k for k in plan.key if k.lower() not in seen]
        if missing:
            raise ConfigInvalid(
                f"merge key column(s) {', '.join(map(repr, missing))} are not among the columns",
                field="key",
            )
    if plan.strategy is LoadStrategy.REPLACE_INTERVAL:
        if plan.interval is None:
            raise ConfigInvalid("replace_interval needs an interval", field="interval")
        if plan.interval_column is None or plan.interval_column.lower() not in seen:
            raise ConfigInvalid(
                "replace_interval needs an interval_column that is one of the columns",
                field="interval_column",
            )
    return seen
