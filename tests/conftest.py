"""Shared fixtures: see tests/fixtures/."""

pytest_plugins = [
    "tests.fixtures.pg",
    "tests.fixtures.mariadb",
    "tests.fixtures.receiver",
    "tests.fixtures.s3",
]
