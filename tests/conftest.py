"""Shared fixtures: see tests/fixtures/."""

pytest_plugins = ["tests.fixtures.pg", "tests.fixtures.mariadb", "tests.fixtures.s3"]
