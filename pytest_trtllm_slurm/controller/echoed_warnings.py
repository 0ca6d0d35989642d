"""A once-per-process warning a worker reported is replayed; if the terminal summary here
imports the same code it would show twice, so an identical one is not recorded again."""

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


@contextmanager
def without_echoes(config: pytest.Config) -> Iterator[None]:
    """Inside pytest's recording of the summary's warnings: drop those a worker reported."""
    replayed = config.stash.get(REPLAYED, None)
    if not replayed:
        yield
        return
    with warnings.catch_warnings(record=True) as caught:  # keeps the filters in force
        yield
    for message in caught:
        category = message.category
        if (f"{category.__module__}.{category.__qualname__}", str(message.message),
                message.filename, message.lineno or 0) in replayed:
            continue
        warnings.warn_explicit(message.message, message.category, message.filename,
                               message.lineno, source=message.source)
