"""`dpone run` start-up: the identity hash prefetched beside the imports, stamina loaded lazily."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpone.adapters.sources import _csvcheck, _prefetch
from dpone.adapters.sources._common import file_identity
from dpone.adapters.sources._passthrough import CsvFileBytes
from dpone.cli import _early
from dpone.errors import SourceInvalid
from dpone.ports.source import RAW_CSV_DELIMITERS, RawCsvRefused
from dpone.testing.crash import write_orders_csv

COLUMNS = ("order_id", "customer", "amount", "ordered_at")
REAL_MAY_FORK = _prefetch._may_fork


def sha(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(_prefetch, "_PREFETCHED", {})
    monkeypatch.setattr(_prefetch, "_PREFETCHED_CHECKS", {})
    monkeypatch.setattr(_prefetch, "_VOUCHED", {})
    monkeypatch.setattr(_early, "_started", False)
    # other tests may leave threads running in this process; the child forked here runs
    # only what ``_prefetch`` imported before forking, so it cannot wait on their locks
    monkeypatch.setattr(_prefetch, "_may_fork", lambda: True)
    # a check a test expects to be used must not be given up on a busy machine
    monkeypatch.setattr(_prefetch, "_CHECK_WAIT_S", 30.0)
    yield
    _prefetch._end_children(wait=True)  # no zombie, no open pipe left behind


def state_of(path: Path) -> _prefetch.StatKey:
    return _prefetch.stat_key(path.stat())


def checked(
    path: Path, delimiter: str = ",", *, crlf: bool = True
) -> _prefetch.CheckedAhead | None:
    """The check made ahead of ``path`` as it is now, for its current bytes."""
    return _prefetch.checked_ahead(
        path, state_of(path), identity=sha(path), delimiter=delimiter, crlf=crlf
    )


def forked(path: Path, delimiter: str = ",") -> _prefetch._ForkedPrefetch:
    """Prefetch ``path`` with its check ahead; the forked child is the one used."""
    _prefetch.prefetch_identity(path, check_csv=delimiter)
    pending = _prefetch._PREFETCHED[str(path.resolve())]
    assert isinstance(pending, _prefetch._ForkedPrefetch)
    return pending


def test_a_csv_file_for_a_scanning_target_is_hashed_and_checked_in_a_forked_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_prefetch, "RACY_NS", 0)  # settled: its stat vouches for it
    data = tmp_path / "a.csv"
    write_orders_csv(data, 1000)  # CRLF line ends, as csv.writer writes them
    pending = forked(data)
    child = pending._pid
    assert child is not None
    assert child != os.getpid()
    assert file_identity(data) == sha(data)
    ahead = checked(data)
    assert ahead == _prefetch.CheckedAhead(
        header=("order_id", "customer", "amount", "ordered_at"), records=1000, refused=None
    )
    with pytest.raises(ChildProcessError):  # reaped: no zombie left behind
        os.waitpid(child, os.WNOHANG)
    # used once; and only for the stat, delimiter and line ends it was made with
    assert checked(data) is None
    forked(data)
    assert file_identity(data) == sha(data)
    assert checked(data, ";", crlf=True) is None
    forked(data)
    assert file_identity(data) == sha(data)
    assert checked(data, ",", crlf=False) is None


@pytest.mark.parametrize(
    ("body", "records", "refused"),
    [
        ("a,b\n1,2\n3,4", 2, None),  # no line end after the last record
        ('a,b\n1,"x\ny"\n', 1, None),  # a line feed inside quotes ends no record
        ("a,b\n1,2\n\n3,4\n", 3, "blank line"),
        ("a,b\n1,2\r3,4\n", 1, "carriage return"),
        ('a,b\n1,x"y"\n', 1, "a quote inside an unquoted field"),
    ],
)
def test_the_check_ahead_finds_what_the_checking_read_finds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, records: int, refused: str | None
) -> None:
    monkeypatch.setattr(_prefetch, "RACY_NS", 0)
    data = tmp_path / "a.csv"
    data.write_bytes(body.encode())
    forked(data)
    assert file_identity(data) == sha(data)
    ahead = checked(data)
    assert ahead is not None
    assert (ahead.header, ahead.refused) == (("a", "b"), refused)
    if refused is None:
        assert ahead.records == records
    raw = CsvFileBytes(data, delimiter=",", columns=("a", "b"), expected_identity=sha(data))
    if refused is None:
        assert sum(1 for _ in raw.chunks(crlf=True, verified_after=True)) == 1
        assert raw.records() == records
    else:
        with pytest.raises(RawCsvRefused, match=refused):
            list(raw.chunks(crlf=True, verified_after=True))


def test_a_file_checked_ahead_is_refused_when_its_header_is_not_the_plans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_prefetch, "RACY_NS", 0)
    data = tmp_path / "a.csv"
    write_orders_csv(data, 1000)
    forked(data)
    assert file_identity(data) == sha(data)
    renamed = ("order_id", "customer", "amount", "ordered")
    file = CsvFileBytes(data, delimiter=",", columns=renamed, expected_identity=sha(data))
    with pytest.raises(RawCsvRefused, match="header names"):
        file.records_checked_ahead(crlf=True)
    forked(data)
    assert file_identity(data) == sha(data)
    file = CsvFileBytes(data, delimiter=",", columns=COLUMNS, expected_identity=sha(data))
    assert file.records_checked_ahead(crlf=True) == 1000
    assert file.records() == 1000
    file.verify_unchanged()  # the stat the check ran on: nothing to hash again


def test_no_check_ahead_holds_for_a_file_written_after_it(tmp_path: Path) -> None:
    data = tmp_path / "a.csv"
    write_orders_csv(data, 1000)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_prefetch, "RACY_NS", 0)
        pending = forked(data)
        assert file_identity(data) == sha(data)
    before = state_of(data)
    time.sleep(0.01)
    raw = bytearray(data.read_bytes())  # same size, other bytes: only the stat tells
    raw[-3:-1] = b"99" if raw[-3:-1] != b"99" else b"98"
    data.write_bytes(bytes(raw))
    assert state_of(data) != before
    assert checked(data) is None
    assert pending._pid is None  # reaped all the same
    file = CsvFileBytes(data, delimiter=",", columns=COLUMNS, expected_identity=sha(data))
    assert file.records_checked_ahead(crlf=True) is None  # the target reads chunks()


def test_a_racy_file_is_hashed_ahead_but_never_checked_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_prefetch, "RACY_NS", 10**18)  # racy however slow the machine
    data = tmp_path / "a.csv"
    write_orders_csv(data, 1000)
    pending = forked(data)
    assert file_identity(data) == sha(data)
    assert pending._pid is None  # the child was ended once its hash was taken
    assert _prefetch._VOUCHED == {}
    assert checked(data) is None


def test_a_child_that_sends_nothing_leaves_the_hash_to_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_prefetch, "RACY_NS", 0)
    monkeypatch.setattr(_prefetch, "_child_hash_and_check", lambda *args: None)
    data = tmp_path / "a.csv"
    write_orders_csv(data, 1000)
    pending = forked(data)
    assert file_identity(data) == sha(data)  # hashed here
    assert pending._pid is None
    assert checked(data) is None


def test_the_check_ahead_waits_only_a_little_for_a_slow_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child still checking when the target asks is ended; the target checks itself."""
    monkeypatch.setattr(_prefetch, "RACY_NS", 0)
    monkeypatch.setattr(_prefetch, "_CHECK_WAIT_S", 0.05)
    check = _csvcheck.Checker.check

    def slow_check(self: _csvcheck.Checker, chunk: bytes, *, final: bool) -> None:
        time.sleep(60)  # in the child: it cannot be done in time
        check(self, chunk, final=final)

    monkeypatch.setattr(_csvcheck.Checker, "check", slow_check)
    statuses: list[int] = []
    waitpid = os.waitpid

    def recorded(pid: int, options: int) -> tuple[int, int]:
        done = waitpid(pid, options)
        statuses.append(done[1])
        return done

    data = tmp_path / "a.csv"
    write_orders_csv(data, 40_000)
    pending = forked(data)
    assert file_identity(data) == sha(data)
    monkeypatch.setattr(_prefetch.os, "waitpid", recorded)
    started = time.monotonic()
    assert checked(data) is None
    assert time.monotonic() - started < 5
    assert pending._pid is None
    assert len(statuses) == 1
    assert os.WIFSIGNALED(statuses[0])  # ended by the parent, not done on its own
    assert os.WTERMSIG(statuses[0]) == signal.SIGKILL


def test_a_child_reaped_by_the_kernel_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With SIGCHLD ignored (a supervisor's choice), waitpid finds no child: not an error."""
    monkeypatch.setattr(_prefetch, "RACY_NS", 0)
    previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        data = tmp_path / "a.csv"
        write_orders_csv(data, 1000)
        forked(data)
        assert file_identity(data) == sha(data)
        ahead = checked(data)
        assert ahead is not None
        assert ahead.records == 1000
        racy = tmp_path / "b.csv"
        write_orders_csv(racy, 1000)
        monkeypatch.setattr(_prefetch, "RACY_NS", 10**18)  # racy: its child is ended
        forked(racy)
        assert file_identity(racy) == sha(racy)
    finally:
        signal.signal(signal.SIGCHLD, previous)


def test_the_child_ends_when_its_parent_is_gone(tmp_path: Path) -> None:
    """A `dpone run` killed mid-way leaves no child reading on."""
    data = tmp_path / "a.csv"
    write_orders_csv(data, 400_000)  # some 15 MB: seconds of reading at a crawl
    probe = (
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from dpone.adapters.sources import _csvcheck, _prefetch\n"
        "check = _csvcheck.Checker.check\n"
        "def crawl(self, chunk, *, final):\n"
        "    time.sleep(0.2)\n"
        "    check(self, chunk, final=final)\n"
        "_csvcheck.Checker.check = crawl\n"
        "_prefetch.RACY_NS = 0\n"
        "_prefetch.prefetch_identity(Path(sys.argv[1]), check_csv=',')\n"
        "print(next(iter(_prefetch._LIVE))._pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", probe, str(data)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        time.sleep(0.5)
        os.kill(child, 0)  # still checking
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()

    def running() -> bool:  # an exited orphan may stay a zombie under some PID 1s
        try:
            state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        return state != "Z"

    deadline = time.monotonic() + 10
    while running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running()


def test_a_child_of_a_process_started_with_stdio_closed_still_sends(tmp_path: Path) -> None:
    """The pipe then takes descriptors 0 and 1: the child moves its end above 2."""
    data = tmp_path / "a.csv"
    write_orders_csv(data, 1000)
    report = tmp_path / "report"
    probe = (
        "import sys\n"
        "from pathlib import Path\n"
        "from dpone.adapters.sources import _prefetch\n"
        "from dpone.adapters.sources._common import file_identity\n"
        "_prefetch.RACY_NS = 0\n"
        "_prefetch.prefetch_identity(Path(sys.argv[1]), check_csv=',')\n"
        "pending = next(iter(_prefetch._LIVE))\n"
        "identity = file_identity(Path(sys.argv[1]))\n"
        "Path(sys.argv[2]).write_text(f'{pending.key is not None} {identity}')\n"
    )
    closed = ["sh", "-c", 'exec "$@" <&- >&- 2>&-', "sh"]  # runs "$@" with no stdio
    done = subprocess.run(
        [*closed, sys.executable, "-c", probe, str(data), str(report)],
        timeout=60,
        check=False,
    )
    assert done.returncode == 0
    assert report.read_text() == f"True {sha(data)}"  # the child's identity, taken


def assert_hashed_in_a_thread(data: Path) -> None:
    """Asked to check ``data`` ahead, the prefetch forks no child: a thread hashes it."""
    write_orders_csv(data, 1000)
    _prefetch.prefetch_identity(data, check_csv=",")
    assert isinstance(_prefetch._PREFETCHED[str(data.resolve())], _prefetch._Prefetch)
    assert file_identity(data) == sha(data)


def test_a_process_with_threads_hashes_in_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forking copies only the calling thread: with others running, no child is forked."""
    monkeypatch.setattr(_prefetch, "_may_fork", REAL_MAY_FORK)
    monkeypatch.setattr(_prefetch.threading, "active_count", lambda: 2)
    assert_hashed_in_a_thread(tmp_path / "a.csv")


def test_a_native_thread_python_does_not_know_of_prevents_the_fork(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_prefetch, "_may_fork", REAL_MAY_FORK)
    monkeypatch.setattr(_prefetch.threading, "active_count", lambda: 1)
    listdir = os.listdir
    monkeypatch.setattr(
        _prefetch.os,
        "listdir",
        lambda path: ["1", "2"] if str(path) == "/proc/self/task" else listdir(path),
    )
    assert_hashed_in_a_thread(tmp_path / "a.csv")


def test_a_file_too_large_to_be_checked_in_time_is_hashed_in_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_prefetch, "CHECK_AHEAD_MAX_BYTES", 1000)  # a 1,000-row file is more
    assert_hashed_in_a_thread(tmp_path / "a.csv")


def test_dpone_run_checks_ahead_only_a_csv_file_for_duckdb(tmp_path: Path) -> None:
    assert _early._PASS_THROUGH_DELIMITERS == RAW_CSV_DELIMITERS
    csv_source = {"kind": "csv", "path": "a.csv"}
    duckdb = {"kind": "duckdb", "url": "duckdb:///t.duckdb", "table": "t"}
    assert _early._checked_ahead_delimiter(csv_source, duckdb) == ","
    assert _early._checked_ahead_delimiter({**csv_source, "delimiter": ";"}, duckdb) == ";"
    assert _early._checked_ahead_delimiter({**csv_source, "delimiter": ":"}, duckdb) is None
    assert _early._checked_ahead_delimiter({"kind": "jsonl", "path": "a.jsonl"}, duckdb) is None
    assert _early._checked_ahead_delimiter(csv_source, {**duckdb, "kind": "postgres"}) is None
    assert _early._checked_ahead_delimiter(csv_source, "duckdb") is None


def test_prefetched_identity_is_the_file_hash_and_is_used_once(tmp_path: Path) -> None:
    data = tmp_path / "a.csv"
    write_orders_csv(data, 1000)
    _prefetch.prefetch_identity(data)
    assert str(data.resolve()) in _prefetch._PREFETCHED
    assert file_identity(data) == sha(data)
    assert _prefetch._PREFETCHED == {}  # taken: a second call hashes the file itself
    assert file_identity(data) == sha(data)


def test_an_identity_is_vouched_for_by_the_stat_only_of_a_settled_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prefetched or not, a file written within RACY_NS of its hash is never vouched for."""
    data = tmp_path / "a.csv"
    write_orders_csv(data, 1000)
    key = str(data.resolve())
    _prefetch.prefetch_identity(data)
    assert file_identity(data) == sha(data)
    assert file_identity(data) == sha(data)  # hashed here, not prefetched
    assert _prefetch._VOUCHED == {}  # just written: racy
    monkeypatch.setattr(_prefetch, "RACY_NS", 0)
    _prefetch.prefetch_identity(data)
    assert file_identity(data) == sha(data)
    stat = data.stat()
    state = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    assert _prefetch.vouched_identity(data, state) == sha(data)
    assert _prefetch.vouched_identity(data, (*state[:4], state[4] + 1)) is None
    del _prefetch._VOUCHED[key]
    assert file_identity(data) == sha(data)  # the same, without the prefetch
    assert _prefetch.vouched_identity(data, state) == sha(data)


def test_a_file_changed_after_the_prefetch_is_hashed_again(tmp_path: Path) -> None:
    data = tmp_path / "a.csv"
    write_orders_csv(data, 1000)
    _prefetch.prefetch_identity(data)
    pending = _prefetch._PREFETCHED[str(data.resolve())]
    pending._thread.join()
    assert pending.identity == sha(data)
    time.sleep(0.01)
    # same size, other bytes: only the timestamps tell
    raw = bytearray(data.read_bytes())
    raw[-3:-1] = b"99" if raw[-3:-1] != b"99" else b"98"
    data.write_bytes(bytes(raw))
    assert file_identity(data) == sha(data) != pending.identity


def test_a_replaced_file_is_hashed_again(tmp_path: Path) -> None:
    data = tmp_path / "a.csv"
    write_orders_csv(data, 1000)
    _prefetch.prefetch_identity(data)
    _prefetch._PREFETCHED[str(data.resolve())]._thread.join()
    other = tmp_path / "b.csv"
    write_orders_csv(other, 1000, start_id=7)
    os.replace(other, data)  # another inode under the same name
    assert file_identity(data) == sha(data)


def test_a_missing_file_still_fails_with_the_usual_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.csv"
    _prefetch.prefetch_identity(missing)
    with pytest.raises(SourceInvalid, match="does not exist"):
        file_identity(missing)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["run", "w.yaml", "--interval", "a/b"], "w.yaml"),
        (["run", "--interval", "a/b", "-q", "w.yaml"], "w.yaml"),
        (["run", "--partition", "p1", "--idempotency-key", "k", "w.yaml"], "w.yaml"),
        (["run", "--interval=a/b", "w.yaml"], "w.yaml"),
        (["run", "--", "-w.yaml"], "-w.yaml"),
        (["journal", "list", "w.yaml"], None),
        (["run", "--interval", "a/b"], None),
        ([], None),
    ],
)
def test_the_workload_argument_of_dpone_run(args: list[str], expected: str | None) -> None:
    assert _early._workload_argument(args) == expected


def _workload(tmp_path: Path, path: str, extra: str = "") -> Path:
    file = tmp_path / "w.yaml"
    file.write_text(
        "workload: w\nrelease: r\ndeployment: d\n"
        f"source: {{kind: csv, path: '{path}'}}\n"
        "target: {kind: sqlite, url: 'sqlite:///t.db', table: t}\n"
        "load: {strategy: append}\n" + extra,
        encoding="utf-8",
    )
    return file


def test_dpone_run_prefetches_a_large_fixed_source_file(tmp_path: Path) -> None:
    write_orders_csv(tmp_path / "big.csv", 40_000)  # over 1 MiB
    wl = _workload(tmp_path, "big.csv")
    _early.prefetch_run_source(["run", str(wl), "--interval", "2026-11-01/2026-11-02"])
    assert list(_prefetch._PREFETCHED) == [str((tmp_path / "big.csv").resolve())]
    _early.prefetch_run_source(["run", str(wl)])  # once per process
    assert len(_prefetch._PREFETCHED) == 1
    assert file_identity(tmp_path / "big.csv") == sha(tmp_path / "big.csv")


@pytest.mark.parametrize(
    ("path", "extra"),
    [
        ("small.csv", ""),  # under 1 MiB: hashed when asked, no thread
        ("p{partition}.csv", ""),  # depends on the run's arguments
        ("big.csv", "publication: {}\n"),  # many partitions: not this peek's business
        ("nope.csv", ""),  # the run reports it
    ],
)
def test_dpone_run_leaves_other_sources_alone(tmp_path: Path, path: str, extra: str) -> None:
    write_orders_csv(tmp_path / "small.csv", 10)
    write_orders_csv(tmp_path / "big.csv", 40_000)
    wl = _workload(tmp_path, path, extra)
    _early.prefetch_run_source(["run", str(wl)])
    assert _prefetch._PREFETCHED == {}


def test_an_unreadable_workload_is_left_to_the_run(tmp_path: Path) -> None:
    bad = tmp_path / "w.yaml"
    bad.write_text("source: [unclosed", encoding="utf-8")
    _early.prefetch_run_source(["run", str(bad)])
    _early._started = False
    _early.prefetch_run_source(["run", str(tmp_path / "missing.yaml")])
    assert _prefetch._PREFETCHED == {}


def test_one_try_does_not_import_stamina_and_hooks_stay_silenced_when_it_loads() -> None:
    probe = (
        "import sys\n"
        "from dpone.runtime.retry import RetryPolicy, call_with_retries, silence_stamina_hooks\n"
        "silence_stamina_hooks()\n"
        "assert call_with_retries(lambda: 1, policy=RetryPolicy()) == 1\n"
        "assert 'stamina' not in sys.modules\n"
        "assert call_with_retries(lambda: 2, policy=RetryPolicy(attempts=3)) == 2\n"
        "import stamina.instrumentation\n"
        "assert list(stamina.instrumentation.get_on_retry_hooks()) == []\n"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)


# ------------------------------------------------------------------ run without typer
def _typer_run_options() -> tuple[set[str], set[str]]:
    """(options that take a value, flags) of the typer ``run`` command."""
    import typer.main

    from dpone.cli.main import app

    group = typer.main.get_command(app)
    command = group.commands["run"]  # type: ignore[attr-defined]
    values: set[str] = set()
    flags: set[str] = set()
    for param in command.params:
        if param.param_type_name != "option":
            continue
        names = {*param.opts, *param.secondary_opts}
        (flags if param.is_flag else values).update(names)
    return values, flags


def test_the_fast_path_reads_exactly_the_typer_run_options() -> None:
    from dpone.cli._run import RUN_FLAGS, RUN_VALUE_OPTIONS

    values, flags = _typer_run_options()
    assert set(RUN_VALUE_OPTIONS) == values == _early._VALUE_OPTIONS
    assert set(RUN_FLAGS) == flags


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--help"],
        ["run"],
        ["run", "a.yaml", "b.yaml"],
        ["run", "a.yaml", "--interval"],
        ["run", "a.yaml", "--interval", "x", "--interval", "y"],
        ["run", "a.yaml", "--log-format", "xml"],
        ["run", "a.yaml", "--unknown"],
        ["run", "a.yaml", "-qv"],
        ["run", "--", "a.yaml"],
        ["journal", "list"],
    ],
)
def test_the_fast_path_leaves_everything_else_to_typer(args: list[str]) -> None:
    from dpone.cli._run import _parse_run

    assert _parse_run(args) is None


def test_the_fast_path_parses_the_run_options() -> None:
    from dpone.cli._run import LogFormat, _parse_run

    parsed = _parse_run(
        [
            "run",
            "--interval=2026-11-01/2026-11-02",
            "w.yaml",
            "--partition",
            "p1",
            "--json",
            "--log-format",
            "json",
            "--no-progress",
            "-q",
            "--idempotency-key",
            "k1",
        ]
    )
    assert parsed == {
        "workload": Path("w.yaml"),
        "interval": "2026-11-01/2026-11-02",
        "partition": "p1",
        "as_json": True,
        "log_format": LogFormat.json,
        "progress": False,
        "quiet": True,
        "idempotency_key": "k1",
    }


def test_both_paths_print_and_exit_alike(tmp_path: Path) -> None:
    """`python -m dpone run` (no typer) and the typer command: same output, same codes."""
    from typer.testing import CliRunner

    from dpone.cli.main import app
    from dpone.testing.crash import run_dpone

    write_orders_csv(tmp_path / "orders.csv", 50)
    wl = _workload(tmp_path, "orders.csv", "journal: sqlite:///j.db\n")
    args = ["run", str(wl), "--interval", "2026-11-01/2026-11-02", "--no-progress", "-q"]
    fast = run_dpone([*args, "--json"], cwd=tmp_path)
    assert fast.returncode == 0, fast.stderr
    first = json_of(fast.stdout)
    assert first["state"] == "COMPLETE"
    assert first["replayed"] is False
    replay = CliRunner().invoke(app, [*args, "--json"])
    assert replay.exit_code == 0, replay.output
    again = json_of(replay.output)
    assert again["replayed"] is True
    assert again["operation_id"] == first["operation_id"]
    text = run_dpone(args, cwd=tmp_path)
    assert text.returncode == 0
    assert text.stdout.startswith(f"COMPLETE {first['operation_id']} rows=50 ")
    assert "(already complete: recorded result returned, nothing written)" in text.stdout
    # an error: the same message and exit code both ways
    missing = ["run", str(tmp_path / "nope.yaml"), "--interval", "2026-11-01/2026-11-02"]
    fast_err = run_dpone(missing, cwd=tmp_path)
    typer_err = CliRunner().invoke(app, missing)
    assert fast_err.returncode == typer_err.exit_code == 2
    assert "DPONE_CONFIG_INVALID" in fast_err.stderr
    assert "does not exist" in fast_err.stderr
    assert "Traceback" not in fast_err.stderr
    # typer still answers what the fast path does not read
    helped = run_dpone(["run", "--help"], cwd=tmp_path)
    assert helped.returncode == 0
    assert "WORKLOAD" in helped.stdout


def json_of(text: str) -> dict[str, object]:
    import json

    value = json.loads(text)
    assert isinstance(value, dict)
    return value


def test_the_collector_is_back_on_before_any_command_runs(tmp_path: Path) -> None:
    """Start-up runs with gc off; the run path and the typer path both turn it back on."""
    write_orders_csv(tmp_path / "orders.csv", 5)
    wl = _workload(tmp_path, "orders.csv")
    probe = (
        "import gc, runpy, sys\n"
        "import dpone.cli._run as r\n"
        "import dpone.cli.main as m\n"
        "def seen(*a, **k):\n"
        "    print('run', gc.isenabled(), bool(gc.get_freeze_count()))\n"
        "    return 0\n"
        "r.run_loaded = seen\n"
        "m.app = lambda: print('typer', gc.isenabled(), bool(gc.get_freeze_count()))\n"
        "sys.argv = ['dpone', *sys.argv[1:]]\n"
        "runpy.run_module('dpone', run_name='__main__')\n"
    )
    for args, expected in (
        (["run", str(wl), "--interval", "2026-11-01/2026-11-02"], "run True True"),
        (["journal", "list", "--workload", str(wl)], "typer True True"),
    ):
        done = subprocess.run(
            [sys.executable, "-c", probe, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.stdout.strip() == expected, done.stderr


def test_the_console_script_entry_reaches_the_typer_commands() -> None:
    import dpone

    probe = "import sys; sys.argv = ['dpone', 'version']; from dpone.cli.entry import main; main()"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == dpone.__version__


def test_a_quiet_run_in_a_pipeline_never_imports_rich(tmp_path: Path) -> None:
    """-q without --progress/--no-progress, stderr not a terminal: rich stays unloaded."""
    write_orders_csv(tmp_path / "orders.csv", 5)
    wl = _workload(tmp_path, "orders.csv", "journal: sqlite:///j.db\n")
    probe = (
        "import runpy, sys\n"
        "sys.argv = ['dpone', *sys.argv[1:]]\n"
        "import atexit\n"
        "atexit.register(lambda: print('rich loaded:', 'rich' in sys.modules))\n"
        "runpy.run_module('dpone', run_name='__main__')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("TTY_COMPATIBLE", "FORCE_COLOR")}

    def quiet_run(interval: str, environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", probe, "run", str(wl), "--interval", interval, "-q"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=tmp_path,
            env=environ,
        )

    done = quiet_run("2026-11-01/2026-11-02", env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("COMPLETE ")
    assert done.stdout.rstrip().endswith("rich loaded: False")
    # where rich would call stderr a terminal, it still decides (and draws the bar)
    forced = quiet_run("2026-11-02/2026-11-03", {**env, "TTY_COMPATIBLE": "1"})
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.rstrip().endswith("rich loaded: True")


#: Modules a quiet ``dpone run`` of a CSV file into SQLite or DuckDB has no use for:
#: other commands (typer, publication, delivery, recovery, Airflow), other targets and
#: journals, retries it will not make (stamina), what a terminal would need (rich) and
#: logging while nothing warns (``dpone.runtime._log``).
NOT_ON_THE_RUN_PATH = (
    "dpone.adapters.delivery",
    "dpone.adapters.objectstores",
    "dpone.airflow",
    "dpone.certification",
    "dpone.cli._logging",
    "dpone.cli.delivery",
    "dpone.cli.main",
    "dpone.cli.publication",
    "dpone.config.delivery",
    "dpone.config.publication",
    "dpone.contracts.delivery",
    "dpone.contracts.objects",
    "dpone.contracts.publication",
    "dpone.publication",
    "dpone.recovery",
    "dpone.runtime.delivery",
    "dpone.runtime.workload_delivery",
    "dpone.testing",
    "airflow",
    "asyncio",
    "click",
    "getpass",
    "httpx",
    "logging",
    "psycopg",
    "psycopg_pool",
    "pymysql",
    "rich",
    "signal",
    "stamina",
    "termios",
    "traceback",
    "typer",
)


def _probed_run(wl: Path, cwd: Path, *, before: str, at_exit: str) -> tuple[str, str]:
    """``dpone run`` of ``wl`` in a fresh process: its result line and what ``at_exit`` printed.

    ``before`` runs first (after ``import atexit, json, sys``); ``at_exit`` is an
    expression printed by an atexit handler, which the run's exit still calls.
    """
    probe = (
        "import atexit, json, sys\n"
        "sys.argv = ['dpone', *sys.argv[1:]]\n"
        f"{before}"
        f"atexit.register(lambda: print({at_exit}))\n"
        "from dpone.cli.entry import main\n"
        "main()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
    done = subprocess.run(
        [sys.executable, "-c", probe, "run", str(wl), "--interval", "2026-11-01/2026-11-02", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    result, printed = done.stdout.splitlines()
    assert result.startswith("COMPLETE ")
    return result, printed


def _run_reporting_modules(wl: Path, cwd: Path) -> tuple[str, set[str]]:
    """``dpone run`` of ``wl`` in a fresh process: its result line and its loaded modules."""
    result, modules = _probed_run(wl, cwd, before="", at_exit="json.dumps(sorted(sys.modules))")
    return result, set(json.loads(modules))


@pytest.mark.parametrize("target", ["sqlite", "duckdb"])
def test_dpone_run_imports_nothing_the_load_does_not_use(tmp_path: Path, target: str) -> None:
    """Each module on this list is start-up time a one-file load pays for nothing."""
    write_orders_csv(tmp_path / "orders.csv", 5)
    url = "sqlite:///t.db" if target == "sqlite" else "duckdb:///t.duckdb"
    wl = tmp_path / "w.yaml"
    wl.write_text(
        "workload: w\nrelease: r\ndeployment: d\njournal: sqlite:///j.db\n"
        "source: {kind: csv, path: orders.csv, columns: {order_id: integer, customer: text, "
        "amount: real, ordered_at: timestamp}}\n"
        f"target: {{kind: {target}, url: '{url}', table: t}}\n"
        "load: {strategy: append}\n",
        encoding="utf-8",
    )
    _, loaded = _run_reporting_modules(wl, tmp_path)
    assert f"dpone.adapters.connectors.{target}" in loaded  # the probe saw the run's imports
    assert sorted(loaded.intersection(NOT_ON_THE_RUN_PATH)) == []


def test_a_quiet_run_loads_logging_at_its_first_warning_and_prints_it_as_configured() -> None:
    """INFO is dropped without logging; the first WARNING configures dpone's handler first."""
    probe = (
        "import sys\n"
        "from dpone.cli._run import LogFormat, _setup_logging\n"
        "from dpone.runtime._log import LazyLogger\n"
        "log = LazyLogger('dpone.runtime')\n"
        "_setup_logging(LogFormat.text, quiet=True, lazy=True)\n"
        "log.info('not shown', extra={'dpone': {'operation_id': 'op-1'}})\n"
        "assert 'logging' not in sys.modules\n"
        "log.warning('careful %s', 'now', extra={'dpone': {'operation_id': 'op-1'}})\n"
        "log.info('still not shown')\n"
        "import logging\n"
        "assert logging.getLogger('dpone').level == logging.WARNING\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["dpone op-1 warning: careful now"]


def test_an_unquiet_run_logs_info_through_the_lazy_loggers() -> None:
    probe = (
        "from dpone.cli._run import LogFormat, _setup_logging\n"
        "from dpone.runtime._log import LazyLogger\n"
        "_setup_logging(LogFormat.json, quiet=False)\n"
        "LazyLogger('dpone.runtime').info('hello', extra={'dpone': {'event': 'e'}})\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stderr)
    assert (record["message"], record["event"], record["level"]) == ("hello", "e", "info")


def test_dpone_run_into_postgres_builds_no_pool(
    tmp_path: Path, pg_available: str, pg_schema: str
) -> None:
    """A one-shot run keeps one journal session: psycopg_pool (and its threads) never load."""
    write_orders_csv(tmp_path / "orders.csv", 5)
    wl = tmp_path / "w.yaml"
    wl.write_text(
        f"workload: w\nrelease: r\ndeployment: d\njournal: '{pg_available}'\n"
        f"journal_schema: {pg_schema}\n"
        "source: {kind: csv, path: orders.csv, columns: {order_id: integer, customer: text, "
        "amount: real, ordered_at: timestamp}}\n"
        f"target: {{kind: postgres, url: '{pg_available}', table: {pg_schema}.t, "
        f"fence_schema: {pg_schema}}}\n"
        "load: {strategy: append}\n",
        encoding="utf-8",
    )
    result, loaded = _run_reporting_modules(wl, tmp_path)
    assert "mode=atomic" in result
    assert "dpone.adapters.journal.postgres" in loaded
    assert "psycopg_pool" not in loaded


def test_a_finished_run_exits_at_once_with_atexit_handlers_output_and_code(
    tmp_path: Path,
) -> None:
    """The fast exit skips teardown only: atexit handlers run, output is whole, codes hold."""
    write_orders_csv(tmp_path / "orders.csv", 20)
    wl = _workload(tmp_path, "orders.csv", "journal: sqlite:///j.db\n")
    probe = (
        "import atexit, sys, threading, time\n"
        "from pathlib import Path\n"
        "atexit.register(lambda: Path('atexit.txt').write_text('ran'))\n"
        "if sys.argv[1] == 'thread':\n"
        "    def late():\n"
        "        time.sleep(0.5)\n"
        "        Path('thread.txt').write_text('finished')\n"
        "    threading.Thread(target=late, daemon=False).start()\n"
        "sys.argv = ['dpone', *sys.argv[2:]]\n"
        "from dpone.cli.entry import main\n"
        "main()\n"
    )

    def dpone(mode: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", probe, mode, *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    run = ["run", str(wl), "--interval", "2026-11-01/2026-11-02", "--no-progress", "-q"]
    done = dpone("plain", *run)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("COMPLETE ")
    assert done.stdout.endswith("\n")
    assert (tmp_path / "atexit.txt").read_text() == "ran"
    (tmp_path / "atexit.txt").unlink()
    # a non-daemon thread still running: the process waits for it, as a normal exit does
    done = dpone("thread", *run)
    assert done.returncode == 0, done.stderr
    assert "already complete" in done.stdout
    assert (tmp_path / "thread.txt").read_text() == "finished"
    assert (tmp_path / "atexit.txt").read_text() == "ran"
    # an error keeps its exit code and its whole message
    done = dpone("plain", "run", str(tmp_path / "nope.yaml"), "--interval", "2026-11-01/2026-11-02")
    assert done.returncode == 2
    assert "DPONE_CONFIG_INVALID" in done.stderr
    assert done.stderr.endswith("\n")


def _dpone_run_counting_checking_reads(wl: Path, cwd: Path) -> tuple[str, int]:
    """``dpone run`` of ``wl`` in a fresh process: its result line and its checking reads."""
    count_reads = (
        "import dpone.adapters.sources._prefetch as prefetch\n"
        "prefetch._CHECK_WAIT_S = 30.0  # a busy machine is no failure\n"
        "import dpone.adapters.connectors.duckdb as connector\n"
        "made = []\n"
        "real = connector._FileCheck\n"
        "connector._FileCheck = lambda raw: made.append(1) or real(raw)\n"
    )
    result, reads = _probed_run(wl, cwd, before=count_reads, at_exit="len(made)")
    return result, int(reads)


def test_dpone_run_into_duckdb_checks_a_settled_file_ahead_and_a_fresh_one_beside_the_scan(
    tmp_path: Path,
) -> None:
    import duckdb

    for name in ("settled", "fresh"):
        (tmp_path / name).mkdir()
        write_orders_csv(tmp_path / name / "orders.csv", 40_000)  # over 1 MiB
        (tmp_path / name / "w.yaml").write_text(
            "workload: w\nrelease: r\ndeployment: d\njournal: sqlite:///j.db\n"
            "source: {kind: csv, path: orders.csv, columns: {order_id: integer, "
            "customer: text, amount: real, ordered_at: timestamp}}\n"
            "target: {kind: duckdb, url: 'duckdb:///t.duckdb', table: t}\n"
            "load: {strategy: append}\n",
            encoding="utf-8",
        )
    time.sleep(_prefetch.RACY_NS / 1e9 + 0.2)  # "settled" was written long enough ago
    fresh = tmp_path / "fresh" / "orders.csv"
    ahead_ns = time.time_ns() + 3600 * 10**9  # racy however long the first run takes
    os.utime(fresh, ns=(ahead_ns, ahead_ns))
    for name, checking_reads in (("settled", 0), ("fresh", 1)):
        cwd = tmp_path / name
        result, reads = _dpone_run_counting_checking_reads(cwd / "w.yaml", cwd)
        assert result.startswith("COMPLETE ")
        assert reads == checking_reads
        with duckdb.connect(str(cwd / "t.duckdb"), read_only=True) as conn:
            loaded = conn.execute("SELECT count(*), count(DISTINCT order_id) FROM t").fetchone()
        assert loaded == (40_000, 40_000)
