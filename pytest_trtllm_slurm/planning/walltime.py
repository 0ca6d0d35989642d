"""A batch's walltime (pure): its tests run one after another, so it may need their summed
``timeout`` marks, capped at the partition's limit; the monitor timeout follows."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

STARTUP_SECONDS = 300  # pytest's start-up and collection in the batch, beside its tests


@dataclass(frozen=True)
class Walltime:
    time_limit: int | None  # seconds the job asks for; None: what it asked for already
    monitor_seconds: int  # the controller's wall-clock watch of the batch
    needed: int | None = None  # what the tests' limits add up to, start-up included
    capped_at: int | None = None  # the partition's limit, when the need was above it


def batch_walltime(timeouts: Iterable[float | None], *, time_limit: int | None,
                   monitor_seconds: int, partition_limit: int | None) -> Walltime:
    """``timeouts``: each test's limit in seconds (None: it has none, counts nothing);
    ``time_limit``: the walltime the batch would ask for (None: the partition's default,
    taken as the monitor timeout, the longest this run lets a batch run anyway)."""
    known = [float(t) for t in timeouts if t and t > 0]
    if not known:
        return Walltime(None, monitor_seconds)
    needed = math.ceil(sum(known)) + STARTUP_SECONDS
    capped = partition_limit if partition_limit is not None and needed > partition_limit \
        else None
    allowed = capped if capped is not None else needed
    have = time_limit if time_limit is not None else monitor_seconds
    limit = allowed if allowed > have else None
    return Walltime(limit, max(monitor_seconds, allowed), needed, capped)
