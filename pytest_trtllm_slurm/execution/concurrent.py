"""Run a few independent set-up steps side by side (one thread each).

Why: a run that spans several clusters connects, checks, syncs and allocates on each of
them; those waits are the clusters' (network, scheduler), not this machine's, so they
overlap instead of adding up. Each step owns its own connection; nothing is shared.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def side_by_side(steps: Mapping[K, Callable[[], V]]) -> dict[K, V]:
    """Each step's result, by key, in the mapping's order. One step runs inline (no
    thread); with several, the first failure (in the mapping's order) is raised once all
    have ended, so no step is left running behind the caller's back."""
    if len(steps) <= 1:
        return {key: step() for key, step in steps.items()}
    with ThreadPoolExecutor(max_workers=len(steps), thread_name_prefix="trtllm-cluster") as pool:
        futures = {key: pool.submit(step) for key, step in steps.items()}
    results: dict[K, V] = {}
    for key, future in futures.items():
        results[key] = future.result()  # re-raises that step's exception
    return results
