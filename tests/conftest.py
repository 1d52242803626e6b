"""Shared fixtures: see tests/fixtures/."""

import os
import tempfile

pytest_plugins = [
    "tests.fixtures.pg",
    "tests.fixtures.mariadb",
    "tests.fixtures.receiver",
    "tests.fixtures.s3",
]

# The workload cache (ADR 0015) of this test session, not the user's: every process the
# tests start inherits it. Tests of the cache itself set their own.
os.environ.setdefault("DPONE_CACHE_DIR", tempfile.mkdtemp(prefix="dpone-test-cache-"))
