"""Real Airflow 3.3.2 and 2.11.2, each in its own virtual environment, for tests/airflow.

The environments live in ``$DPONE_AIRFLOW_VENVS`` (default ``<repo>/.airflow-venvs``) and
are created once with ``uv`` when missing or when ``pyproject.toml`` changed (dpone is
installed editable with the ``airflow`` and ``postgres`` extras). Each version gets one
migrated metadata database per session; every test copies it into its own
``AIRFLOW_HOME``. Work for the two versions runs concurrently (:func:`both`): the
machine has two cores.

Under ``CI=true`` nothing here skips: a missing ``uv`` or a failed install fails the run.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

REPO = Path(__file__).resolve().parents[2]
#: version label -> exact Airflow release under test
AIRFLOW_VERSIONS = {"3.3": "3.3.2", "2.11": "2.11.2"}
COMPAT_PIN = "apache-airflow-providers-common-compat==1.23.0"
# Airflow 2.11 sets an attribute on cryptography's MultiFernet (models/crypto.py), which
# cryptography 51 made a Rust object that takes no attributes; 50.x is the last that works.
VERSION_PINS = {"2.11.2": ("cryptography<51",)}
#: dpone's extras in each environment: a PostgreSQL journal needs psycopg in the
#: worker and in the triggerer (the delivery trigger's AsyncConnection)
DPONE_EXTRAS = "airflow,postgres"
#: uv does not write bytecode by default, and every Airflow command runs with
#: PYTHONDONTWRITEBYTECODE: without compiling at install, each process (scheduler, task,
#: ``dags test``) compiled Airflow's modules from source again (~3x the import time)
UV_INSTALL_FLAGS = ("--compile-bytecode",)
JWT_SECRET = "dpone-tests-jwt-secret-not-a-real-one-0123456789"  # noqa: S105 - test-only key
T = TypeVar("T")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # `-m "not airflow"` deselects every test that needs the Airflow environments
    for item in items:
        if "airflows" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.airflow)


def _venv_root() -> Path:
    return Path(os.environ.get("DPONE_AIRFLOW_VENVS") or REPO / ".airflow-venvs")


def _uv() -> list[str]:
    if importlib.util.find_spec("uv") is not None:
        return [sys.executable, "-m", "uv"]
    found = shutil.which("uv")
    if found:
        return [found]
    _unavailable("uv is not installed (pip install uv, or install the dev extra)")
    raise AssertionError("unreachable")


def _unavailable(why: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"Airflow test environment unavailable under CI: {why}")
    pytest.skip(f"Airflow test environment unavailable: {why}")


def _stamp(version: str) -> str:
    pyproject = (REPO / "pyproject.toml").read_bytes()
    return hashlib.sha256(
        version.encode()
        + COMPAT_PIN.encode()
        + " ".join(VERSION_PINS.get(version, ())).encode()
        + DPONE_EXTRAS.encode()
        + " ".join(UV_INSTALL_FLAGS).encode()
        + pyproject
        + str(REPO).encode()
    ).hexdigest()


def _ensure_venv(version: str) -> Path:
    """Create (or reuse) the virtual environment of one Airflow release."""
    root = _venv_root()
    root.mkdir(parents=True, exist_ok=True)
    venv = root / f"airflow-{version}"
    stamp = venv / "dpone-stamp.txt"
    with (root / f".lock-{version}").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text() == _stamp(version):
            return venv
        uv = _uv()
        python = venv / "bin" / "python"
        steps = [
            [*uv, "venv", "--quiet", "--clear", "--python", sys.executable, str(venv)],
            [
                *uv, "pip", "install", "--quiet", *UV_INSTALL_FLAGS, "--python", str(python),
                f"apache-airflow=={version}", COMPAT_PIN, *VERSION_PINS.get(version, ()),
                "-e", f"{REPO}[{DPONE_EXTRAS}]",
            ],
        ]  # fmt: skip
        for argv in steps:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
            if done.returncode != 0:
                _unavailable(f"{' '.join(argv[:4])} failed:\n{done.stderr[-3000:]}")
        stamp.write_text(_stamp(version))
        return venv


@dataclass(frozen=True)
class Airflow:
    """One installed Airflow release and its migrated template metadata database."""

    label: str
    version: str
    venv: Path
    template_home: Path

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)

    def home(self, where: Path) -> Path:
        """A fresh AIRFLOW_HOME with a copy of the migrated metadata database."""
        home = where / f"home-{self.label}"
        shutil.copytree(self.template_home, home)
        return home

    def env(self, home: Path, dags: Path, **extra: str) -> dict[str, str]:
        """The environment of an Airflow command: this home, this DAG folder, quiet."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYTHON"))}
        env.update(
            AIRFLOW_HOME=str(home),
            # airflow.cfg was written for the template home: point at this copy
            AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'airflow.db'}",
            AIRFLOW__LOGGING__BASE_LOG_FOLDER=str(home / "logs"),
            AIRFLOW__CORE__DAGS_FOLDER=str(dags),
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False",
            AIRFLOW__METRICS__TIMER_UNIT_CONSISTENCY="True",
            AIRFLOW__API_AUTH__JWT_SECRET=JWT_SECRET,
            AIRFLOW__LOGGING__LOGGING_LEVEL="INFO",
            PYTHONDONTWRITEBYTECODE="1",
            # executors start `airflow tasks run ...` by name
            PATH=f"{self.venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        )
        env.update(extra)
        return env

    def run(
        self, argv: list[str], env: dict[str, str], *, timeout: float = 240
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.bin(argv[0]), *argv[1:]],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=env["AIRFLOW_HOME"],
        )


def both(airflows: dict[str, Airflow], work: Callable[[Airflow], T]) -> dict[str, T]:
    """Run ``work`` for every Airflow release at once; re-raise the first failure."""
    with ThreadPoolExecutor(max_workers=len(airflows)) as pool:
        futures = {label: pool.submit(work, af) for label, af in airflows.items()}
        return {label: future.result() for label, future in futures.items()}


def _prepare(label: str, version: str, base: Path) -> Airflow:
    venv = _ensure_venv(version)
    home = base / f"template-{label}"
    home.mkdir()
    airflow = Airflow(label=label, version=version, venv=venv, template_home=home)
    done = airflow.run(["airflow", "db", "migrate"], airflow.env(home, base / "no-dags"))
    if done.returncode != 0:
        _unavailable(f"airflow {version} db migrate failed:\n{done.stdout[-2000:]}")
    return airflow


@pytest.fixture(scope="session")
def airflows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Airflow]:
    """Both Airflow releases, installed and migrated (concurrently, once per session)."""
    base = tmp_path_factory.mktemp("airflow")
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            label: pool.submit(_prepare, label, version, base)
            for label, version in AIRFLOW_VERSIONS.items()
        }
        ready = {label: future.result() for label, future in futures.items()}
    print(f"\n[airflow] environments ready in {time.monotonic() - started:.1f}s")
    return ready
