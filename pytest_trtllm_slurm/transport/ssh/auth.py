"""SSH user authentication: key/agent, then (if the cluster wants it) a one-time code.

``mfa = false``: key only; ``true``: then keyboard-interactive; unset: that only when the
server asks. The code is fetched per login, held only in a local variable: it never
reaches disk, logs, exceptions or repr()."""

from __future__ import annotations

import functools
import getpass
import logging
import os
import shlex
import subprocess
import sys
from collections.abc import Callable

from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.transport.ssh.hostkeys import fingerprint
from pytest_trtllm_slurm.transport.ssh.otp_env import OTP_ENV, HeldCode
from pytest_trtllm_slurm.transport.ssh.paramiko_lib import paramiko
from pytest_trtllm_slurm.transport.ssh.target import SSHTarget

log = logging.getLogger(__name__)

DEFAULT_KEY_FILES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
KI = "keyboard-interactive"
PROMPT = "the terminal prompt"


class OneTimeCode:
    """A one-time code plus where it came from; repr() and str() never show the code."""

    __slots__ = ("_value", "source")

    def __init__(self, value: str, source: str) -> None:
        self._value = value
        self.source = source

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"OneTimeCode(source={self.source!r}, value='***')"

    __str__ = __repr__


#: Called once per login that needs a code (a reconnect asks again: TOTP codes expire).
OtpProvider = Callable[[SSHTarget], "OneTimeCode | str"]


def can_prompt() -> bool:
    """A person can type a code: the real stdin is a terminal and this is not CI."""
    stdin = sys.__stdin__
    return bool(stdin and stdin.isatty()) and not os.environ.get("CI")


def default_otp_provider(target: SSHTarget, held: HeldCode | None = None) -> OneTimeCode:
    """TRTLLM_SLURM_OTP (``held``: the run's, taken out of os.environ so that no child
    process inherits it), else ``otp_command`` (run locally), else a terminal prompt."""
    value = (held or HeldCode()).current()
    if value:
        return OneTimeCode(value, f"the {OTP_ENV} environment variable")
    if target.otp_command:
        return OneTimeCode(run_otp_command(target), f"otp_command of {target.where}")
    if can_prompt():
        code = getpass.getpass(f"One-time code for {target.display}: ").strip()
        if code:
            return OneTimeCode(code, PROMPT)
    raise ConfigError(
        f"{target.display} asks for a one-time code (keyboard-interactive) and none is "
        f"available (no terminal to prompt on). Supply it with {OTP_ENV}=<code> for this run, "
        f"or set otp_command = \"<command printing the current code>\" in {target.where}")


def otp_provider(held: HeldCode | None) -> OtpProvider:
    """The default provider, reading the run's held TRTLLM_SLURM_OTP (None: the
    environment's only)."""
    return functools.partial(default_otp_provider, held=held)


def run_otp_command(target: SSHTarget) -> str:
    """Run ``otp_command`` (argv via shlex.split, no shell); its stripped stdout is the code."""
    argv = shlex.split(target.otp_command or "")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = "timed out" if isinstance(exc, subprocess.TimeoutExpired) else str(exc)
        raise ConfigError(f"otp_command of {target.where} could not run: {why}") from None
    code = proc.stdout.strip()
    if proc.returncode != 0 or not code:
        why = f"exit code {proc.returncode}" if proc.returncode else "printed nothing"
        raise ConfigError(
            f"otp_command of {target.where} failed ({why}); it must print the current "
            "one-time code on stdout and exit 0")
    return code


def load_keys(target: SSHTarget) -> list[tuple[str, paramiko.PKey]]:
    """(label, key) to offer: identity files, then agent keys, then default key files."""
    keys: list[tuple[str, paramiko.PKey]] = []
    for path in target.identity_files:
        if not os.path.isfile(path):
            if target.identity_file_explicit:
                raise ConfigError(f"identity_file {path} in {target.where} does not exist")
            log.debug("ssh: identity file %s not found; skipped", path)
            continue
        _load_file(path, keys)
    if not target.identities_only and os.environ.get("SSH_AUTH_SOCK"):
        try:
            for key in paramiko.Agent().get_keys():
                keys.append((f"agent key {fingerprint(key)}", key))
        except (paramiko.SSHException, OSError) as exc:
            log.debug("ssh: agent not usable: %s", exc)
    if not target.identity_files:
        for path in map(os.path.expanduser, DEFAULT_KEY_FILES):
            if os.path.isfile(path):
                _load_file(path, keys)
    return keys


def _load_file(path: str, keys: list[tuple[str, paramiko.PKey]]) -> None:
    try:
        keys.append((path, paramiko.PKey.from_path(path)))
    except paramiko.PasswordRequiredException:
        log.debug("ssh: %s is encrypted; load it into ssh-agent to use it", path)
    except (paramiko.SSHException, OSError, ValueError) as exc:
        log.debug("ssh: %s could not be loaded: %s", path, exc)


def authenticate(transport: paramiko.Transport, target: SSHTarget,
                 otp_provider: OtpProvider) -> None:
    """Log in on a started transport, or raise ConfigError naming the host and the fix."""
    keys = load_keys(target)
    remaining: list[str] | None = None  # methods still required after a key was accepted
    allowed: list[str] | None = None  # methods the server offers before any success
    for label, key in keys:
        try:
            result = transport.auth_publickey(target.user, key)
        except paramiko.BadAuthenticationType as exc:
            allowed = list(exc.allowed_types)
            break
        except paramiko.AuthenticationException:
            log.debug("ssh: %s refused key %s", target.display, label)
            continue
        if transport.is_authenticated():
            log.debug("ssh: %s accepted key %s", target.display, label)
            return
        remaining = list(result)
        log.debug("ssh: %s accepted key %s and asks for %s", target.display, label, remaining)
        break
    if remaining is None and allowed is None:  # no key offered, or all were refused
        try:
            transport.auth_none(target.user)
        except paramiko.BadAuthenticationType as exc:
            allowed = list(exc.allowed_types)
        except paramiko.AuthenticationException:
            pass
        if transport.is_authenticated():
            return
    _second_step(transport, target, otp_provider, keys, remaining, allowed or [])


def _second_step(transport: paramiko.Transport, target: SSHTarget, otp_provider: OtpProvider,
                 keys: list[tuple[str, paramiko.PKey]], remaining: list[str] | None,
                 allowed: list[str]) -> None:
    tried = ", ".join(label for label, _ in keys) or "none found"
    if remaining is not None:  # the key was accepted; the server wants more
        if KI not in remaining:
            raise ConfigError(
                f"{target.display} accepted the key but then asks for {remaining}, which is "
                "not supported (only keyboard-interactive one-time codes are)")
        if target.mfa is False:
            raise ConfigError(
                f"configuration problem: {target.display} accepted the key and then asks for "
                f"a one-time code (keyboard-interactive), but mfa = false in {target.where}. "
                "Set mfa = true (or remove the mfa line) for this cluster")
        return _keyboard_interactive(transport, target, otp_provider)
    wants_code = allowed == [KI] if target.mfa is None else (target.mfa and KI in allowed)
    if wants_code:
        return _keyboard_interactive(transport, target, otp_provider)
    raise ConfigError(
        f"configuration problem: SSH key authentication to {target.display} failed (keys "
        f"tried: {tried}; the server offers {allowed or 'nothing more'}). Check user, "
        f"identity_file and ssh_host in {target.where} (or ~/.ssh/config), that the public "
        "key is in the cluster's authorized_keys, or load the key into ssh-agent"
        + ("; mfa = false, so no one-time code is tried" if target.mfa is False else ""))


def _keyboard_interactive(transport: paramiko.Transport, target: SSHTarget,
                          otp_provider: OtpProvider) -> None:
    attempts = 3  # a person at the prompt may retype a code; any other source is tried once
    for attempt in range(1, attempts + 1):
        code = otp_provider(target)
        if isinstance(code, str):
            code = OneTimeCode(code, "the one-time code provider")
        source = code.source

        def handler(title: str, instructions: str, prompts: list, _c: OneTimeCode = code) -> list:
            # every prompt of every round gets the code; an empty round gets no answers
            return [_c.reveal() for _ in prompts]

        try:
            transport.auth_interactive(target.user, handler)
        except paramiko.AuthenticationException:
            if source == PROMPT and attempt < attempts and transport.is_active():
                continue
            raise ConfigError(
                f"{target.display} refused the one-time code from {source} "
                "(keyboard-interactive). Supply a current code: "
                f"{OTP_ENV}=<code>, otp_command in {target.where}, or a terminal prompt") from None
        finally:
            del code, handler
            if getattr(transport, "auth_handler", None) is not None:  # drop paramiko's ref too
                transport.auth_handler.interactive_handler = None
        if transport.is_authenticated():
            log.debug("ssh: %s accepted the one-time code from %s", target.display, source)
            return
        raise ConfigError(
            f"{target.display} still asks for more after the one-time code; not supported")
