"""Run a few independent set-up steps side by side, one daemon thread each: several
clusters' connection, sync and allocation waits overlap instead of adding up."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Background(Generic[V]):
    """One step in a daemon thread; ``result`` waits and raises what the step raised."""

    def __init__(self, step: Callable[[], V], name: str = "trtllm-cluster") -> None:
        self._step = step
        self._value: V | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._step()
        except BaseException as exc:  # noqa: BLE001 - handed to whoever asks for the result
            self._error = exc

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> None:
        self._thread.join()

    def result(self) -> V:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


def side_by_side(steps: Mapping[K, Callable[[], V]]) -> dict[K, V]:
    """Each step's result by key (one runs inline); the first failure raised once all ended."""
    if len(steps) <= 1:
        return {key: step() for key, step in steps.items()}
    running = {key: Background(step) for key, step in steps.items()}
    for job in running.values():
        job.wait()
    return {key: job.result() for key, job in running.items()}
