"""What counts as a secret, and how it is hidden (standard library only: the node side uses it).

One rule, used wherever an environment or a value could be written or shown (job_spec.json,
the warm workers' mailboxes, re-run lines, logs):

- by name: a variable whose name has a secret word as one of its parts (``HF_TOKEN``,
  ``GITHUB_PAT``, ``AWS_SECRET_ACCESS_KEY``, ``DB_PASSWORD``, ``githubToken``), or a part
  ending in one of the longer ones (``APIKEY``, ``HFTOKEN``). Parts, not substrings: ``PATH``,
  ``KEYBOARD``, ``TOKENIZERS_PARALLELISM`` or ``AUTHOR`` are not secrets, nor are names
  that say where a secret is (``SSH_AUTH_SOCK``, ``SSL_KEY_FILE``, ``XDG_SESSION_TYPE``);
- by value: credentials in a URL (``http://user:pass@proxy``: only the password is hidden;
  ``https://<token>@host``) and values that look like well-known tokens (``ghp_...``,
  ``hf_...``, private keys).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

MASK = "***"

#: name parts that make a variable secret
SECRET_PARTS = frozenset({
    "TOKEN", "TOKENS", "PAT", "SECRET", "SECRETS", "PASSWORD", "PASSWORDS", "PASSWD", "PASS",
    "PASSPHRASE", "KEY", "KEYS", "CREDENTIAL", "CREDENTIALS", "CREDS", "AUTH", "COOKIE",
    "COOKIES", "SESSION", "OTP", "APIKEY", "PRIVATE",
})
#: a name part ending in one of these is secret too (``APIKEY``, ``HFTOKEN``, ``OAUTH``)
SECRET_SUFFIXES = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIALS",
                   "CREDENTIAL", "COOKIE", "AUTH")

#: a name ending in one of these parts names where a secret is, not the secret itself
#: (``SSH_AUTH_SOCK``, ``SSL_KEY_FILE``, ``XDG_SESSION_TYPE``): such values change with each
#: login, and hiding them would only hide where things are
LOCATOR_PARTS = frozenset({"SOCK", "SOCKET", "PID", "FILE", "PATH", "DIR", "TYPE", "CLASS",
                           "HOST", "PORT", "ADDRESS", "MANAGER", "DESKTOP"})
#: well-known names of the login session that only look secret
NOT_SECRET = frozenset({"XDG_SESSION_ID", "DESKTOP_SESSION"})

# camelCase and digit boundaries as well as separators: githubToken -> GITHUB, TOKEN
_NAME_PARTS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
# scheme://user:password@host -> the password part (group 2)
_URL_CREDENTIALS = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*:)([^\s/@]+)(@)")
# tokens that are secrets whatever variable holds them
_TOKEN_VALUES = re.compile(
    r"(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{20,}"
    r"|hf_[A-Za-z0-9]{20,}|xox[abposr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}"
    r"|sk-[A-Za-z0-9_-]{20,}|-----BEGIN [A-Z ]*PRIVATE KEY-----"
    r"|(?<=://)[A-Za-z0-9_-]{20,}(?=@))")  # a token as a URL's user name


def name_parts(name: str) -> list[str]:
    """``HF_TOKEN`` -> [HF, TOKEN]; ``githubToken`` -> [GITHUB, TOKEN]."""
    return [part.upper() for part in _NAME_PARTS.findall(name)]


def is_secret_name(name: str) -> bool:
    """True when a variable of this name holds a secret, whatever its value."""
    parts = name_parts(name)
    if not parts or parts[-1] in LOCATOR_PARTS or name.upper() in NOT_SECRET:
        return False
    return any(part in SECRET_PARTS or part.endswith(SECRET_SUFFIXES) for part in parts)


def has_secret_value(value: str) -> bool:
    """True when the value itself carries a credential (URL password, known token)."""
    return bool(_URL_CREDENTIALS.search(value) or _TOKEN_VALUES.search(value))


def is_secret(name: str, value: str) -> bool:
    """The variable must not be written anywhere as it is."""
    return is_secret_name(name) or has_secret_value(value)


def mask_text(text: str) -> str:
    """``text`` with URL passwords and known tokens replaced by ``***`` (for logs)."""
    return _TOKEN_VALUES.sub(MASK, _URL_CREDENTIALS.sub(rf"\g<1>{MASK}\g<3>", text))


def mask_value(name: str, value: str) -> str:
    """What may be shown of ``name=value``: ``***`` for a secret name, else the value
    with its embedded credentials hidden."""
    return MASK if is_secret_name(name) else mask_text(value)


def is_masked(value: str) -> bool:
    """A value (or part of one) that ``mask_value`` hid: not usable as it is."""
    return MASK in value


def mask_env(env: Mapping[str, str]) -> dict[str, str]:
    """An environment safe to write or log (same names, secret values hidden)."""
    return {name: mask_value(name, value) for name, value in env.items()}


def without_secrets(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` that are not secret (for files others may come to read)."""
    return {name: value for name, value in env.items() if not is_secret(name, value)}


def only_secrets(env: Mapping[str, str]) -> dict[str, str]:
    """The variables ``without_secrets`` leaves out."""
    return {name: value for name, value in env.items() if is_secret(name, value)}
