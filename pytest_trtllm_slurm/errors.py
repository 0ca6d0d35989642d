"""Errors the user can act on: a ConfigError is a pytest usage error (exit code 4) at the
pytest face, a non-zero exit with the message at the CLI; never a traceback."""

from __future__ import annotations


class ConfigError(Exception):
    """Bad user input: names the input, what was found, what is expected."""


class ExecutionError(Exception):
    """A job could not be submitted or watched (scheduler, shell, engine)."""


class TestSpecError(ConfigError):
    """One test's own device markers or perf-sanity id cannot be read: that test errors
    with the message, the others plan and run (not a usage error of the whole run)."""

    __test__ = False  # not a test class, even when imported into a test module
