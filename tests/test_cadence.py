"""The polling cadence lives in one place (execution/cadence.py): its readers take its
values, and the scheduler's adaptive interval backs off and snaps back as documented."""

from __future__ import annotations

import inspect

from pytest_trtllm_slurm.execution import build
from pytest_trtllm_slurm.execution.cadence import CADENCE, Cadence
from pytest_trtllm_slurm.execution.monitor import Monitor
from pytest_trtllm_slurm.execution.slurm.executor import SlurmExecutor, SlurmSettings
from pytest_trtllm_slurm.transport.shell import LocalShell


def test_the_readers_take_the_cadence_values() -> None:
    assert Monitor([]).poll_interval == CADENCE.monitor == 0.2
    executor = SlurmExecutor(LocalShell(), SlurmSettings(persistent=False))
    assert (executor.settings.min_interval, executor.settings.max_interval) == (0.5, 5.0)
    assert executor.poll_hint is None  # no warm workers: the monitor's own pace
    assert inspect.signature(build.run_build).parameters["poll_interval"].default == 0.5
    assert CADENCE.warm_hint(local=True) == 0.02 and CADENCE.warm_hint(local=False) == 0.2


def test_the_scheduler_interval_grows_when_quiet_and_snaps_back_on_a_change() -> None:
    cadence = Cadence()
    interval, seen = 0.5, []
    for _ in range(8):
        interval = cadence.next_scheduler_interval(interval, changed=False, low=0.5, high=5.0)
        seen.append(interval)
    assert seen[:3] == [0.75, 1.125, 1.6875] and seen[-1] == 5.0  # capped
    assert cadence.next_scheduler_interval(5.0, changed=True, low=0.5, high=5.0) == 0.5


def test_the_run_loop_waits_longer_while_nothing_happens_up_to_the_monitor_pace() -> None:
    cadence = Cadence()
    wait, seen = CADENCE.warm_hint(local=True), []
    for _ in range(10):
        wait = cadence.next_idle_wait(wait, base=CADENCE.warm_hint(local=True))
        seen.append(round(wait, 4))
    assert seen[0] == 0.03 and seen[-1] == CADENCE.idle_max == CADENCE.monitor  # capped
    # a slower monitor (no warm workers) keeps its own pace
    assert cadence.next_idle_wait(0.5, base=0.5) == 0.5


def test_many_active_batches_stretch_the_wait_between_rounds_up_to_the_monitor_pace() -> None:
    warm = CADENCE.warm_hint(local=True)
    assert CADENCE.round_wait(warm, 1) == CADENCE.round_wait(warm, 8) == warm
    assert CADENCE.round_wait(warm, 9) == 2 * warm
    assert CADENCE.round_wait(warm, 85) == CADENCE.idle_max  # 32 nodes: 85 batches
    assert CADENCE.round_wait(CADENCE.monitor, 85) == CADENCE.monitor
    assert CADENCE.round_wait(0.5, 1) == 0.5
