"""One DEBUG log line per command the plugin runs through a Shell (every scheduler, SSH and
engine command passes there once), in the ``pytest_trtllm_slurm`` logger tree, secrets
masked (``planning.masking``); a command's input is never logged."""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from pytest_trtllm_slurm.planning.masking import mask_argv, mask_text

log = logging.getLogger("pytest_trtllm_slurm.commands")

_TAIL = 200  # characters of stderr shown for a failed command


def masked_argv(argv: Sequence[str]) -> str:
    """``argv`` as one shell-quoted string, secrets hidden (``masking.mask_argv``: option
    values by the option's name, ``NAME=value`` by the allow-list, tokens by value)."""
    return shlex.join(mask_argv(argv))


@contextmanager
def timed_command(host: str, argv: Sequence[str]) -> Iterator[list]:
    """Time a command; the caller puts its CommandResult-like outcome in the yielded list
    (``returncode``, ``timed_out``, ``stderr`` attributes). Logged also when it raises."""
    outcome: list = []
    started = time.monotonic()
    try:
        yield outcome
    finally:
        if log.isEnabledFor(logging.DEBUG):
            result = outcome[0] if outcome else None
            returncode = getattr(result, "returncode", None)
            timed_out = bool(getattr(result, "timed_out", False))
            stderr = str(getattr(result, "stderr", "") or "")
            if timed_out:
                end = "timed out"
            elif returncode is None:
                end = "did not finish (connection lost)"
            else:
                end = f"exit code {returncode}"
            detail = ""
            if (timed_out or returncode) and stderr.strip():
                detail = ": " + mask_text(stderr.strip().splitlines()[-1][-_TAIL:])
            # one line per command even for a multi-line script (``sh -c`` of a lock's holder)
            shown = masked_argv(argv).replace("\n", "\\n")
            log.debug("%s: `%s` %s in %.3f s%s", host, shown, end,
                      time.monotonic() - started, detail)
