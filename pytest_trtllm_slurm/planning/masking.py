"""What counts as a secret and how it is hidden (stdlib only: the node side uses it); showing is
an allow-list, secrets are found by name parts and by value (docs/security-model.md)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

MASK = "***"

#: name parts that make a variable secret
SECRET_PARTS = frozenset({
    "TOKEN", "TOKENS", "PAT", "SECRET", "SECRETS", "PASSWORD", "PASSWORDS", "PASSWD", "PASS",
    "PASSPHRASE", "KEY", "KEYS", "CREDENTIAL", "CREDENTIALS", "CREDS", "AUTH", "COOKIE",
    "COOKIES", "SESSION", "OTP", "APIKEY", "PRIVATE", "PWD", "JWT", "DSN", "WEBHOOK",
    "WEBHOOKS", "BEARER", "PASSCODE",
})
#: a name part ending in one of these is secret too (``APIKEY``, ``HFTOKEN``, ``OAUTH``)
SECRET_SUFFIXES = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIALS",
                   "CREDENTIAL", "COOKIE", "AUTH", "PASS", "PWD", "JWT", "DSN", "WEBHOOK")

#: a name ending in one of these parts names where a secret is, not the secret itself
#: (``SSH_AUTH_SOCK``, ``SSL_KEY_FILE``): hiding them would only hide where things are
LOCATOR_PARTS = frozenset({"SOCK", "SOCKET", "PID", "FILE", "PATH", "DIR", "TYPE", "CLASS",
                           "HOST", "PORT", "ADDRESS", "MANAGER", "DESKTOP"})
#: well-known names of the login session that only look secret
NOT_SECRET = frozenset({"XDG_SESSION_ID", "DESKTOP_SESSION", "PWD", "OLDPWD"})

#: names whose values may be shown (unless a secret by name or value)
SHOWN_NAMES = frozenset({
    "PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "HOME", "USER", "LOGNAME", "SHELL",
    "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR", "PWD", "HOSTNAME", "PYTHONUNBUFFERED",
    "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE", "PYTHONWARNINGS", "PYTHONFAULTHANDLER",
    "PYTEST_XDIST_WORKER", "PYTEST_XDIST_TESTRUNUID", "PYTEST_XDIST_WORKER_COUNT",
    "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "TOKENIZERS_PARALLELISM",
    "LLM_MODELS_ROOT", "LLM_ROOT", "LLM_BACKEND_ROOT", "MODEL_CACHE_DIR", "HF_HOME",
    "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "NO_PROXY", "no_proxy",
    "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "CI",
})
#: name prefixes whose values may be shown (unless a secret by name or value)
SHOWN_PREFIXES = ("CUDA_", "NCCL_", "SLURM_", "OMP_", "MKL_", "LC_", "UCX_", "PMIX_",
                  "TORCH_", "TRTLLM_SLURM_", "TRTLLM_CASE_", "TLLM_", "XDG_", "PYTHON", "MPI_",
                  "OMPI_MCA_")

_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)\Z", re.DOTALL)
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
    """The variable must not be written anywhere as it is (PYTEST_ADDOPTS: when an
    option in it is named like a secret)."""
    if name == "PYTEST_ADDOPTS" and any(is_secret_option(word) for word in value.split()
                                         if word.startswith("-")):
        return True
    return is_secret_name(name) or has_secret_value(value)


def mask_text(text: str) -> str:
    """``text`` with URL passwords and known tokens replaced by ``***`` (for logs)."""
    return _TOKEN_VALUES.sub(MASK, _URL_CREDENTIALS.sub(rf"\g<1>{MASK}\g<3>", text))


def may_show(name: str) -> bool:
    """True when the value of variable ``name`` may be shown (the allow-list)."""
    return ((name in SHOWN_NAMES or name.startswith(SHOWN_PREFIXES))
            and not is_secret_name(name))


def is_secret_option(option: str) -> bool:
    """``--api-token``, ``--password``, ``--hf_token=...``: an option named like a secret."""
    name = option.lstrip("-").partition("=")[0]
    return bool(name) and is_secret_name(name.replace("-", "_"))


def _masked_word(word: str) -> str:
    """A ``NAME=value`` word of a command line (``env K=V``, ``-o cache_dir=...``): its
    value hidden when the name is a secret; any word: URL passwords and tokens hidden."""
    match = _ASSIGNMENT.match(word)
    if match and is_secret_name(match.group(1)):
        return f"{match.group(1)}={MASK}"
    return mask_text(word)


def mask_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` safe to show: values of options and ``NAME=value`` words named like secrets
    hidden, and URL passwords and known tokens anywhere."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        if arg.startswith("-") and len(arg) > 1 and is_secret_option(arg):
            flag, eq, _ = arg.partition("=")
            out.append(f"{flag}={MASK}" if eq else arg)
            hide_next = not eq
            continue
        if arg.startswith("--") and "=" in arg:  # --export=HF_TOKEN=..., --env=K=V
            flag, _, value = arg.partition("=")
            out.append(f"{flag}={_masked_word(value)}")
            continue
        out.append(_masked_word(arg))
    return out


def is_masked(value: str) -> bool:
    """A value (or part of one) that ``mask_env`` hid: not usable as it is."""
    return MASK in value


def mask_env(env: Mapping[str, str]) -> dict[str, str]:
    """An environment safe to write or log: same names, values not on the allow-list
    (``may_show``) hidden, embedded credentials hidden in the others."""
    return {name: mask_text(value) if may_show(name) else MASK for name, value in env.items()}


def without_secrets(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` that are not secret (for files others may come to read)."""
    return {name: value for name, value in env.items() if not is_secret(name, value)}


def only_secrets(env: Mapping[str, str]) -> dict[str, str]:
    """The variables ``without_secrets`` leaves out."""
    return {name: value for name, value in env.items() if is_secret(name, value)}


def shown_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables whose values may be written to a file (a launcher script, a mailbox
    request): allow-listed names (``may_show``) whose values carry no credential."""
    return {name: value for name, value in env.items()
            if may_show(name) and not has_secret_value(value)}


def hidden_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables ``shown_env`` leaves out: their values travel only through a process's
    environment (or a pipe), never through a file; their names may be written."""
    shown = shown_env(env)
    return {name: value for name, value in env.items() if name not in shown}
