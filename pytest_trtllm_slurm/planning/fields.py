"""Field types every model shares: a value that reaches a script, an argv or an env is
checked once (a ``safe_values`` AfterValidator), with the same words wherever it was given."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BeforeValidator, ValidationError

import pytest_trtllm_slurm.planning.safe_values as safe_values

T = TypeVar("T")


def checked(value: T, check: Callable[[Any], str | None]) -> T:
    """``value`` unchanged, or the ValueError pydantic reports for its field when ``check``
    (a safe_values check) finds a problem; None passes."""
    if value is not None:
        problem = check(value)
        if problem:
            raise ValueError(problem)
    return value


def _check(problem: Callable[[Any], str | None]) -> AfterValidator:
    return AfterValidator(lambda value: checked(value, problem))


#: one string may stand for a list of one (``mounts="a:b"``), before the list is checked
OneOrMany = BeforeValidator(lambda value: [value] if isinstance(value, str) else value)

OneLine = Annotated[str, _check(safe_values.line_problem)]  # paths, names, device types
SlurmName = Annotated[str, _check(safe_values.slurm_name_problem)]  # account, partition
Argument = Annotated[str, _check(safe_values.argument_problem)]  # one argv word, not an option
JobName = Argument  # a Slurm job name: any one-line text, not empty, no option
Host = Annotated[str, _check(safe_values.host_problem)]
User = Annotated[str, _check(safe_values.user_problem)]
MountPath = Annotated[str, _check(safe_values.mount_path_problem)]
Mounts = Annotated[list[str], _check(safe_values.mounts_problem)]
MountTuple = Annotated[tuple[str, ...], _check(safe_values.mounts_problem)]  # frozen models
Argv = Annotated[list[str], _check(safe_values.argv_problem)]
Env = Annotated[dict[str, str], _check(safe_values.env_problem)]


def validation_message(exc: ValidationError, *, prefix: str = "",
                       found_unknown: bool = True) -> str:
    """Every problem of ``exc`` as ``<prefix><field>: <why> (found <value>)``; with
    ``found_unknown`` False an unknown key shows no value (it is the key that is wrong)."""
    return "; ".join(
        f"{prefix}{'.'.join(str(p) for p in err['loc']) or 'value'}: "
        f"{err['msg'].removeprefix('Value error, ')}"
        + (f" (found {err['input']!r})"
           if found_unknown or err["type"] != "extra_forbidden" else "")
        for err in exc.errors()
    )
