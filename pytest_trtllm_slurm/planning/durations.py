"""One grammar for Slurm times, read two ways (pure): ``parse_time_limit`` what a user typed
(stricter: a bare number is refused), ``parse_duration`` what Slurm printed (None on junk)."""

from __future__ import annotations

import re
from typing import NamedTuple

from pytest_trtllm_slurm.errors import ConfigError

TIME_FORMATS = "1h, 30m, 3600s, 1h30m, HH:MM:SS, MM:SS or D-HH:MM:SS"
UNLIMITED_SECONDS = 10**9  # "no limit": larger than any limit a run compares it with
_UNLIMITED = ("UNLIMITED", "INFINITE")

_GRAMMAR = re.compile(
    r"(?:(?P<d>[0-9]+)d)?(?:(?P<h>[0-9]+)h)?(?:(?P<m>[0-9]+)m)?(?:(?P<s>[0-9]+)s)?"  # 1h30m
    r"|(?:(?P<days>[0-9]+)-)?(?P<clock>[0-9]+(?::[0-9]+){0,2})",  # [D-]A[:B[:C]]
    re.ASCII,
)


class Parsed(NamedTuple):
    """One duration as written: units (``1d2h3m4s``) or a clock (``[D-]A[:B[:C]]``)."""

    units: tuple[int, int, int, int] | None  # days, hours, minutes, seconds
    days: str | None  # the clock's day part (None: no ``D-``)
    fields: tuple[str, ...]  # the clock's 1-3 numbers, as written (widths matter to users)


def _split(text: str) -> Parsed | None:
    """The grammar: ``text`` (already stripped) as units or a clock; None if neither."""
    match = _GRAMMAR.fullmatch(text)
    if match is None or not text:
        return None
    if match["clock"] is None:
        units = tuple(int(match[g] or 0) for g in "dhms")
        return Parsed((units[0], units[1], units[2], units[3]), None, ())
    return Parsed(None, match["days"], tuple(match["clock"].split(":")))


def _seconds(days: int, hours: int, minutes: int, seconds: int) -> int:
    return days * 86400 + hours * 3600 + minutes * 60 + seconds


def _clock(nums: list[int]) -> int:
    """``MM:SS`` or ``HH:MM:SS`` as numbers."""
    hours, minutes, secs = ([0] + nums)[-3:]
    return _seconds(0, hours, minutes, secs)


def _user_clock(parsed: Parsed) -> int | None:
    """``MM:SS``, ``HH:MM:SS`` (hours unbounded) or ``D-HH:MM:SS``; every field after the
    first is one or two digits and below 60 (hours below 24 after a day)."""
    fields = parsed.fields
    if any(len(f) > 2 for f in fields[1:]):
        return None
    nums = [int(f) for f in fields]
    if parsed.days is not None:
        if len(nums) != 3 or len(fields[0]) > 2 or nums[0] >= 24:
            return None
        hours, minutes, secs = nums
        return None if minutes >= 60 or secs >= 60 else _seconds(
            int(parsed.days), hours, minutes, secs)
    if len(nums) == 1 or any(n >= 60 for n in nums[1:]):
        return None  # a bare number: Slurm's minutes, or seconds? refused, not guessed
    return _clock(nums)


def parse_time_limit(text: str, *, what: str = "time limit") -> int:
    """Seconds in a duration a user gave (``1h30m``, ``HH:MM:SS``, ``MM:SS``, ``D-HH:MM:SS``);
    a ConfigError naming ``what`` otherwise (a bare number too: minutes or seconds?)."""
    parsed = _split(str(text).strip().lower())
    seconds = None
    if parsed is not None:
        seconds = _seconds(*parsed.units) if parsed.units is not None else _user_clock(parsed)
    if seconds is None:
        raise ConfigError(f"{what}: found {text!r}; expected a duration such as {TIME_FORMATS}")
    return seconds


def parse_duration(text: str | None) -> int | None:
    """Seconds in a Slurm time as squeue/sacct print it (``0:30`` is 30 *seconds*);
    UNLIMITED / INFINITE -> ``UNLIMITED_SECONDS``; other words and junk -> None."""
    if text is None:
        return None
    text = text.strip()
    if text.upper() in _UNLIMITED:
        return UNLIMITED_SECONDS
    parsed = _split(text)
    if parsed is None or parsed.units is not None:
        return None  # Slurm neither prints nor takes 1h30m
    nums = [int(f) for f in parsed.fields]
    if parsed.days is not None:
        hours, minutes, secs = (nums + [0, 0])[:3]
        return _seconds(int(parsed.days), hours, minutes, secs)
    return nums[0] * 60 if len(nums) == 1 else _clock(nums)  # a bare number is minutes


def slurm_time(text: object, what: str) -> str | None:
    """A user's duration as ``sbatch --time`` takes it (None stays None)."""
    return None if text is None else format_slurm_time(parse_time_limit(str(text), what=what))


def format_slurm_time(seconds: int) -> str:
    """``D-HH:MM:SS`` (a day or more) or ``HH:MM:SS``: what ``sbatch --time`` takes."""
    if seconds < 0:
        raise ValueError(f"negative duration: {seconds}")
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock
