"""planning.durations: one grammar for Slurm times, a user reading and a scheduler reading.

Slurm's own ``--time`` forms are minutes, minutes:seconds, hours:minutes:seconds,
days-hours, days-hours:minutes and days-hours:minutes:seconds; squeue/sacct print
``[D-]HH:MM:SS`` or ``MM:SS`` or a word. Each form is checked in both readings.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.planning.durations import (
    UNLIMITED_SECONDS,
    format_slurm_time,
    parse_duration,
    parse_time_limit,
)

# form, text, what Slurm means (seconds), whether a user may type it
SLURM_FORMS = [
    ("minutes", "5", 300, False),  # refused from users: minutes or seconds?
    ("minutes:seconds", "0:30", 30, True),
    ("minutes:seconds", "45:30", 2730, True),
    ("hours:minutes:seconds", "1:00:00", 3600, True),
    ("hours:minutes:seconds", "36:00:00", 129600, True),
    ("days-hours", "2-00", 172800, False),
    ("days-hours:minutes", "1-02:03", 93780, False),
    ("days-hours:minutes:seconds", "1-02:03:04", 93784, True),
]


@pytest.mark.parametrize(("form", "text", "seconds", "user_ok"), SLURM_FORMS,
                         ids=[f"{f}:{t}" for f, t, _, _ in SLURM_FORMS])
def test_each_slurm_form_in_both_readings(form: str, text: str, seconds: int,
                                          user_ok: bool) -> None:
    assert parse_duration(text) == seconds, form
    if user_ok:
        assert parse_time_limit(text) == seconds, form
    else:
        with pytest.raises(ConfigError, match="expected a duration such as"):
            parse_time_limit(text, what="--slurm-time-limit")


@pytest.mark.parametrize(("text", "seconds"), [
    ("UNLIMITED", UNLIMITED_SECONDS), ("INFINITE", UNLIMITED_SECONDS),
    ("unlimited", UNLIMITED_SECONDS), (" 00:05:00 ", 300), ("7-00:00:00", 604800),
    ("00:00", 0), ("1:75", 135),  # Slurm adds out-of-range fields up; squeue never prints them
    ("INVALID", None), ("NOT_SET", None), ("Partition_Limit", None), ("N/A", None),
    ("", None), ("  ", None), (None, None), ("1h", None), ("1:2:3:4", None),
    ("-5", None), ("1-", None), ("1.5", None), ("1-2-3", None), ("\u0665", None),
])
def test_scheduler_reading(text: str | None, seconds: int | None) -> None:
    """What squeue/sacct print (TimeLimit, TimeLeft, Elapsed): words are None, except the
    two that mean no limit; nothing raises."""
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(("text", "seconds"), [
    ("1h", 3600), ("30m", 1800), ("3600s", 3600), ("1h30m", 5400), ("2d", 172800),
    ("1d2h3m4s", 93784), (" 10M ", 600), ("0s", 0), ("01:00:00", 3600), ("0-23:59:59", 86399),
])
def test_user_reading_accepts(text: str, seconds: int) -> None:
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize("text", [
    "", "90", "1x", "h", "1:60", "1:2:3:4", "1-24:00:00", "1-02:03", "-5m", "1.5h",
    "1h 30m", "abc", "UNLIMITED", "1:005", "1-002:03:04", "2-00", "1m1h", "\u0665m",
])
def test_user_reading_refuses_with_the_forms(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_time_limit(text, what="--slurm-time-limit")
    message = str(info.value)
    assert message.startswith(f"--slurm-time-limit: found {text!r}; expected a duration")
    assert "1h30m" in message and "HH:MM:SS" in message and "D-HH:MM:SS" in message


@given(st.integers(min_value=0, max_value=400 * 86400))
def test_what_we_write_both_readings_read_back(seconds: int) -> None:
    """format_slurm_time's text (what sbatch gets) reads back the same either way."""
    text = format_slurm_time(seconds)
    assert parse_time_limit(text) == seconds
    assert parse_duration(text) == seconds


@given(st.integers(0, 400), st.integers(0, 23), st.integers(0, 59), st.integers(0, 59))
def test_scheduler_day_forms(d: int, h: int, m: int, s: int) -> None:
    assert parse_duration(f"{d}-{h}") == d * 86400 + h * 3600
    assert parse_duration(f"{d}-{h}:{m:02d}") == d * 86400 + h * 3600 + m * 60
    assert parse_duration(f"{d}-{h:02d}:{m:02d}:{s:02d}") == d * 86400 + h * 3600 + m * 60 + s
