"""Warnings this process raises again after a worker reported them (the pytest face).

Code that warns once per process (a deprecated import, a module-level ``warnings.warn``)
warns in the worker, where the test that first imported it ran, and that warning is
replayed against the test. When the controller's end of the run imports the same code
(hypothesis writes its failing-example patch with libcst at the terminal summary), the
same warning would be raised a second time: a plain run, one process, shows it once. So
a warning raised here while the terminal summary is written, identical (category,
message, file and line) to one a worker reported, is not recorded again.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

WarningKey = tuple[str, str, str, int]
REPLAYED = pytest.StashKey[set[WarningKey]]()


def note_replayed(config: pytest.Config, key: WarningKey) -> None:
    """A worker's warning was replayed: this process need not raise it again."""
    config.stash.setdefault(REPLAYED, set()).add(key)


def key_of(message: warnings.WarningMessage) -> WarningKey:
    category = message.category
    return (f"{category.__module__}.{category.__qualname__}", str(message.message),
            message.filename, message.lineno or 0)


@contextmanager
def without_echoes(config: pytest.Config) -> Iterator[None]:
    """Inside pytest's own recording of the terminal summary's warnings: those raised in
    the block pass on to it unless a worker reported them already."""
    replayed = config.stash.get(REPLAYED, None)
    if not replayed:
        yield
        return
    with warnings.catch_warnings(record=True) as caught:  # keeps the filters in force
        yield
    for message in caught:
        if key_of(message) in replayed:
            continue
        warnings.warn_explicit(message.message, message.category, message.filename,
                               message.lineno, source=message.source)
