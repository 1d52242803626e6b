"""``dpone certify``: prove a route's fence against its live target, and write evidence.

Certification runs, on a scratch table next to the workload's target and through the
workload's own journal: a fence conformance probe, the crash matrix (SIGKILL at every
failpoint, rerun, count), a race of several processes on one operation, an intent
conflict and a bad-input check. Each check is VERIFIED, FAILED or UNVERIFIED (the
environment could not be reached or the connector offers no way to count rows). The
evidence (JSON plus a Markdown rendering) names the connector, its capability, the
target database and server version, and every figure; never a secret.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

import dpone
from dpone.config.bootstrap import Route, build_route
from dpone.config.evidence import EVIDENCE_DIR, VERIFIED, evidence_path
from dpone.config.workload import Workload, load_workload, parse_workload
from dpone.contracts.fence import FenceCapability, FenceStatus, SealOutcome
from dpone.contracts.identity import Interval
from dpone.contracts.load import Column, ColumnType, LoadPlan, LoadStrategy
from dpone.errors import ConfigInvalid, DponeError, FencedOut
from dpone.runtime.failpoints import FAILPOINT_NAMES
from dpone.testing import crash

__all__ = ["Certification", "Check", "certify"]

FAILED, UNVERIFIED = "FAILED", "UNVERIFIED"
ROWS = 100
_COLUMNS = {"order_id": "integer", "customer": "text", "amount": "real", "ordered_at": "timestamp"}


@dataclass(slots=True)
class Check:
    """One certification check and its figures."""

    name: str
    status: str = UNVERIFIED
    detail: str = ""
    figures: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass(slots=True)
class Certification:
    """The evidence of one ``dpone certify`` run."""

    dpone_version: str
    connector: str
    capability: str
    database: str
    server_version: str
    certified_at: str
    checks: list[Check]

    @property
    def verdict(self) -> str:
        """VERIFIED only when every check is; FAILED if any failed; else UNVERIFIED."""
        statuses = {c.status for c in self.checks}
        if statuses == {VERIFIED}:
            return VERIFIED
        return FAILED if FAILED in statuses else UNVERIFIED

    def to_json(self) -> dict[str, Any]:
        """The evidence as JSON-ready data."""
        return {**asdict(self), "verdict": self.verdict, "format": 1}

    def to_markdown(self) -> str:
        """A readable rendering of the evidence."""
        lines = [
            f"# Route certification: {self.verdict}",
            "",
            f"- connector: `{self.connector}` (capability `{self.capability}`)",
            f"- target database: `{self.database}` ({self.server_version})",
            f"- dpone {self.dpone_version}, {self.certified_at}",
            "",
            "| check | status | figures | seconds | detail |",
            "|---|---|---|---|---|",
        ]
        for c in self.checks:
            figures = ", ".join(f"{k}={v}" for k, v in c.figures.items())
            lines.append(f"| {c.name} | {c.status} | {figures} | {c.seconds:.1f} | {c.detail} |")
        return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- running
Progress = Callable[[str, str], None]  # (check name, status or "running")


@contextmanager
def _timed(check: Check, progress: Progress) -> Iterator[Check]:
    progress(check.name, "running")
    started = time.monotonic()
    try:
        yield check
    except DponeError as exc:
        check.status = UNVERIFIED if exc.retryable else FAILED
        check.detail = f"{exc.code.value}: {exc.message}"
    finally:
        check.seconds = time.monotonic() - started
        progress(check.name, check.status)


def _certifiable(workload: Workload) -> Workload:
    if workload.publication is not None:
        raise ConfigInvalid(
            "dpone certify checks one target connector's fence; a publication workload has a "
            "staging_generation writer per partition, covered by its own conformance and "
            "crash suites (docs/publication.md)",
            field="target.kind",
            hint="certify a workload whose target is a database",
        )
    return workload


def certify(
    workload_path: Path,
    *,
    out_dir: Path | None = None,
    progress: Progress | None = None,
) -> tuple[Certification, Path]:
    """Certify the route of ``workload_path``; write the evidence and return it and its path."""
    report = progress or (lambda _name, _status: None)
    workload = _certifiable(load_workload(workload_path))
    scratch_table = f"dpone_certify_{secrets.token_hex(4)}"
    probe_workload = _scratch_workload(workload, workload_path, scratch_table, "probe")
    checks = [
        Check("reachability"),
        Check("fence_conformance"),
        Check("crash_matrix"),
        Check("race"),
        Check("intent_conflict"),
        Check("bad_input"),
    ]
    route: Route | None = None
    connector_kind, capability, database, server = workload.target.kind, "?", "?", "?"
    try:
        with _timed(checks[0], report) as check:
            route = build_route(probe_workload)
            connector_kind = route.connector.kind
            capability = route.connector.capability.value
            database = route.connector.database_locator()
            version = getattr(route.connector, "server_version", None)
            server = version() if version is not None else "unknown"
            route.journal.list_entries(limit=1)  # the journal answers too
            check.status, check.figures = VERIFIED, {"server": server}
        if route is not None and route.connector.capability is FenceCapability.NONE:
            checks[1].status = FAILED
            checks[1].detail = (
                "capability none: the connector cannot prove whether a write committed, so "
                "the route is not certifiable; it stays allowed but never replays "
                "automatically (a crash after COMMITTING ends in COMMIT_UNKNOWN)"
            )
            for c in checks[2:]:
                c.detail = "not applicable to capability none"
        elif route is not None and checks[0].status == VERIFIED:
            with _timed(checks[1], report) as check:
                _fence_probe(route, scratch_table, check)
            # embedded targets (DuckDB) lock their file while open: let the runs have it
            route.connector.close()
            counts = getattr(route.connector, "count_rows", None)
            if counts is None:
                for c in checks[2:]:
                    c.detail = "the connector offers no row count (TargetProbePort)"
            else:
                _campaign(workload, workload_path, scratch_table, route, checks[2:], report)
    finally:
        if route is not None:
            drop = getattr(route.connector, "drop_table", None)
            if drop is not None:
                try:
                    drop(_table_of(route, scratch_table))
                except DponeError:
                    pass  # secondary: a leftover scratch table is harmless
            route.close()
    for c in checks:
        if c.status == UNVERIFIED and not c.detail:
            c.detail = "not run: the target or journal could not be reached"
    result = Certification(
        dpone_version=dpone.__version__,
        connector=connector_kind,
        capability=capability,
        database=database,
        server_version=server,
        certified_at=datetime.now(UTC).isoformat(timespec="seconds"),
        checks=checks,
    )
    directory = out_dir or (workload.base_dir / EVIDENCE_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    path = evidence_path(directory, connector_kind, database)
    path.write_text(json.dumps(result.to_json(), indent=2), encoding="utf-8")
    path.with_suffix(".md").write_text(result.to_markdown(), encoding="utf-8")
    return result, path


def _scratch_workload(workload: Workload, workload_path: Path, table: str, name: str) -> Workload:
    """The workload's route (journal, target database) aimed at a scratch table."""
    data = _raw(workload_path)
    data.update(
        workload="dpone_certify",
        release=f"certify-{name}",
        deployment=workload.deployment,
        source={"kind": "csv", "path": "unused.csv", "columns": _COLUMNS},
        load={"strategy": "append"},
        lease_ttl_seconds=5,
    )
    data.pop("recovery", None)
    data.pop("require_certified", None)
    target = dict(data["target"])
    if "table" in target:
        schema = str(target["table"]).rpartition(".")[0]
        target["table"] = f"{schema}.{table}" if schema else table
    data["target"] = target
    return parse_workload(data, base_dir=workload.base_dir)


def _raw(workload_path: Path) -> dict[str, Any]:
    loaded = yaml.safe_load(workload_path.read_text(encoding="utf-8"))
    return dict(loaded) if isinstance(loaded, dict) else {}


# ---------------------------------------------------------------------------- fence probe
def _fence_probe(route: Route, table: str, check: Check) -> None:
    """The fence contract of ARCHITECTURE section 7, against the live target."""
    connector = route.connector
    target_table = _table_of(route, table)
    plan = LoadPlan(
        table=target_table,
        strategy=LoadStrategy.APPEND,
        columns=tuple(Column(name=n, type=ColumnType(t)) for n, t in _COLUMNS.items()),
    )
    rows = [(i, "c", "1.5", "2026-11-01T00:00:00Z") for i in range(5)]
    failures: list[str] = []

    def expect(ok: bool, what: str) -> None:
        if not ok:
            failures.append(what)

    op, intent = _op("probe-a"), _op("intent-a")
    expect(connector.observe(operation_id=op).status is FenceStatus.ABSENT, "observe absent")
    seen = connector.prepare(operation_id=op, intent_digest=intent, epoch=2)
    expect((seen.status, seen.epoch) == (FenceStatus.PREPARED, 2), "prepare installs")
    expect(
        _refused(lambda: connector.prepare(operation_id=op, intent_digest=intent, epoch=1)),
        "prepare never lowers the epoch",
    )
    expect(
        _refused(
            lambda: connector.mutate(
                operation_id=op,
                intent_digest=intent,
                epoch=1,
                plan=plan,
                batches=[rows],
                content_digest="d",
            )
        ),
        "a stale epoch cannot write",
    )
    report = connector.mutate(
        operation_id=op,
        intent_digest=intent,
        epoch=2,
        plan=plan,
        batches=[rows],
        content_digest="d",
    )
    seen = connector.observe(operation_id=op)
    expect((seen.status, seen.row_count) == (FenceStatus.COMMITTED, 5), "commit is observable")
    expect(report.row_count == 5, "mutate reports its rows")
    # forward mode takes a reported committed row as the proof instead of observing
    # (ADR 0013): it must be exactly the row observe reads
    expect(
        report.committed is None or report.committed == seen,
        "a reported commit is what observe reads",
    )
    expect(
        _refused(
            lambda: connector.mutate(
                operation_id=op,
                intent_digest=intent,
                epoch=2,
                plan=plan,
                batches=[rows],
                content_digest="d",
            )
        ),
        "a committed fence is terminal",
    )
    expect(
        connector.seal(operation_id=op, epoch=9).outcome is SealOutcome.COMMITTED,
        "seal after commit reports COMMITTED",
    )
    op2, intent2 = _op("probe-b"), _op("intent-b")
    expect(
        connector.seal(operation_id=op2, epoch=4).outcome is SealOutcome.NOT_COMMITTED,
        "seal on absent proves not committed",
    )
    expect(
        _refused(
            lambda: connector.mutate(
                operation_id=op2,
                intent_digest=intent2,
                epoch=3,
                plan=plan,
                batches=[rows],
                content_digest="d",
                prepare=True,
            )
        ),
        "after a seal the old epoch cannot write",
    )

    def boom(_txn: object) -> None:
        raise DponeError("certification: rollback probe")

    op3, intent3 = _op("probe-c"), _op("intent-c")
    try:
        connector.mutate(
            operation_id=op3,
            intent_digest=intent3,
            epoch=1,
            plan=plan,
            batches=[rows],
            content_digest="d",
            within=boom,
            prepare=True,
        )
        failures.append("a failing transaction must raise")
    except DponeError:
        pass
    expect(
        connector.observe(operation_id=op3).status is not FenceStatus.COMMITTED,
        "a failed transaction commits no fence",
    )
    counts = getattr(connector, "count_rows", None)
    if counts is not None:
        total, _ = counts(target_table, distinct="order_id")
        expect(total == 5, f"exactly the committed rows are in the target (found {total})")
    check.figures = {"probes": 12, "failed": len(failures)}
    check.status = FAILED if failures else VERIFIED
    check.detail = "; ".join(f"violated: {f}" for f in failures)
    drop = getattr(connector, "drop_table", None)
    if drop is not None:
        drop(target_table)


def _refused(call: Callable[[], object]) -> bool:
    try:
        call()
    except FencedOut:
        return True
    return False


def _op(label: str) -> str:
    return "sha256:" + hashlib.sha256(f"{label}{secrets.token_hex(8)}".encode()).hexdigest()


def _table_of(route: Route, table: str) -> str:
    identity = route.connector.target_identity()
    qualified = identity.rpartition("#")[2]
    schema = qualified.rpartition(".")[0]
    return f"{schema}.{table}" if schema and schema != "main" else table


# ---------------------------------------------------------------------------- crash campaign
def _campaign(
    workload: Workload,
    workload_path: Path,
    table: str,
    route: Route,
    checks: list[Check],
    report: Progress,
) -> None:
    campaign = _Campaign(workload, workload_path, _table_of(route, table), route)
    runs = (campaign.crash, campaign.race, campaign.intent, campaign.bad)
    try:
        for check, run in zip(checks, runs, strict=True):
            with _timed(check, report):
                run(check)
    finally:
        for leftover in workload.base_dir.glob(".dpone-certify-*.yaml"):
            leftover.unlink(missing_ok=True)
        shutil.rmtree(campaign.work, ignore_errors=True)


class _Campaign:
    """Real `dpone run` processes on the scratch table, each operation with its own rows."""

    def __init__(self, workload: Workload, workload_path: Path, table: str, route: Route) -> None:
        self.workload = workload
        self.raw = _raw(workload_path)
        self.table = table
        self.count: Callable[..., tuple[int, int]] = route.connector.count_rows  # type: ignore[attr-defined]
        self.release = route.connector.close
        self.work = workload.base_dir / EVIDENCE_DIR / f"run-{secrets.token_hex(4)}"
        self.work.mkdir(parents=True, exist_ok=True)
        self.expected = 0
        self.day = 0

    @property
    def cwd(self) -> Path:
        return self.workload.base_dir

    def operation(self, label: str) -> tuple[tuple[str, ...], Path]:
        """A fresh operation with its own interval and id range: (run args, its CSV)."""
        self.day += 1
        start = datetime(2030, 1, 1, tzinfo=UTC) + timedelta(days=self.day)
        window = Interval(start=start, end=start + timedelta(days=1))
        data = self.work / f"{label}.csv"
        crash.write_orders_csv(data, ROWS, start_id=self.day * 1_000_000)
        spec = dict(self.raw)
        spec.update(
            workload="dpone_certify",
            release="certify",
            lease_ttl_seconds=2,
            source={"kind": "csv", "path": str(data), "columns": _COLUMNS},
            load={"strategy": "append"},
        )
        spec.pop("recovery", None)
        spec.pop("require_certified", None)
        target = dict(spec["target"])
        if "table" in target:
            target["table"] = self.table
        spec["target"] = target
        name = f".dpone-certify-{label}.yaml"
        (self.cwd / name).write_text(json.dumps(spec), encoding="utf-8")
        return ("run", name, "--interval", window.canonical(), "--no-progress", "-q"), data

    def rows(self) -> tuple[int, int]:
        try:
            return self.count(self.table, distinct="order_id")
        finally:
            self.release()  # never hold an embedded target's file lock between runs

    def crash(self, check: Check) -> None:
        """SIGKILL at every failpoint, rerun until done: every row once, never unknown."""
        kills = unfinished = 0
        for point in FAILPOINT_NAMES:
            args, _ = self.operation(point.replace(":", "_").replace(".", "_"))
            first = crash.run_dpone(args, cwd=self.cwd, failpoints=f"{point}=kill")
            kills += first.returncode == -9
            outcome = crash.run_until_done(args, cwd=self.cwd)
            self.expected += ROWS
            unfinished += outcome.final != 0 or crash.EXIT_COMMIT_UNKNOWN in outcome.codes
        total, distinct = self.rows()
        check.figures = {
            "operations": len(FAILPOINT_NAMES),
            "kills": kills,
            "rows": total,
            "expected_rows": self.expected,
            "duplicates": total - distinct,
            "unfinished": unfinished,
        }
        ok = kills > 0 and total == distinct == self.expected and unfinished == 0
        check.status = VERIFIED if ok else FAILED

    def race(self, check: Check) -> None:
        """Four processes start the same operation at once: exactly one mutation."""
        args, _ = self.operation("race")
        procs = [crash.start_dpone(args, cwd=self.cwd) for _ in range(4)]
        codes = sorted(p.wait(timeout=300) for p in procs)
        for p in procs:
            p.communicate()
        outcome = crash.run_until_done(args, cwd=self.cwd)
        self.expected += ROWS
        total, distinct = self.rows()
        check.figures = {
            "processes": 4,
            "exit_codes": codes,
            "duplicates": total - distinct,
            "rows": total,
            "expected_rows": self.expected,
        }
        ok = outcome.final == 0 and total == distinct == self.expected
        check.status = VERIFIED if ok else FAILED

    def intent(self, check: Check) -> None:
        """The same operation with other input is refused (exit 4) and writes nothing."""
        args, data = self.operation("intent")
        first = crash.run_dpone(args, cwd=self.cwd)
        self.expected += ROWS
        crash.write_orders_csv(data, ROWS + 1, start_id=self.day * 1_000_000)
        second = crash.run_dpone(args, cwd=self.cwd)
        total, _ = self.rows()
        check.figures = {
            "exit_codes": [first.returncode, second.returncode],
            "rows": total,
            "expected_rows": self.expected,
        }
        ok = first.returncode == 0 and second.returncode == 4 and total == self.expected
        check.status = VERIFIED if ok else FAILED

    def bad(self, check: Check) -> None:
        """A malformed source row fails clearly (no traceback) and writes nothing."""
        args, data = self.operation("bad")
        with data.open("a", encoding="utf-8") as fh:
            fh.write("1,2\n")  # a row with the wrong number of fields
        proc = crash.run_dpone(args, cwd=self.cwd)
        total, _ = self.rows()
        check.figures = {
            "exit_code": proc.returncode,
            "rows": total,
            "expected_rows": self.expected,
        }
        ok = proc.returncode not in (0, 3) and total == self.expected
        check.status = VERIFIED if ok and "Traceback" not in proc.stderr else FAILED
