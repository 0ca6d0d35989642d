"""The ``trtllm-slurm`` command: each subcommand's ``add_<name>(subparsers)`` in
``SUBCOMMANDS`` sets ``handler(args) -> int``; a ConfigError is one stderr line, exit 4."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import Any

import pytest_trtllm_slurm.transport.ssh.otp_env as otp_env
from pytest_trtllm_slurm.cli.alloc import add_alloc_parser
from pytest_trtllm_slurm.cli.run import add_run_parser
from pytest_trtllm_slurm.errors import ConfigError, ExecutionError
from pytest_trtllm_slurm.execution.probe import probe_local_env
from pytest_trtllm_slurm.execution.slurm.client import SlurmClient
from pytest_trtllm_slurm.planning.jobspec import SlurmEnv
from pytest_trtllm_slurm.planning.models import LocalEnv
from pytest_trtllm_slurm.transport.shell import LocalShell

EXIT_OK, EXIT_NO_SLURM, EXIT_PARTIAL, EXIT_CONFIG = 0, 1, 2, 4

Subparsers = Any  # argparse's private _SubParsersAction
Adder = Callable[[Subparsers], object]


# --------------------------------------------------------------------------- env


def add_env(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "env", help="show what this machine and its Slurm offer",
        description="Probe this machine (GPUs, container engine, Slurm) and discover the local "
        "Slurm cluster (accounts, partitions, GPUs per node, arch, pmix). Exit 0: complete; "
        "1: no Slurm client tools; 2: partial (see errors).",
    )
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--partitions", default=None, metavar="A,B",
                   help="only these partitions (comma separated)")
    p.add_argument(
        "--cluster", default=None, metavar="NAME",
        help="cluster to inspect: the local one, or a [clusters.NAME] of the clusters file "
        "(discovered over SSH)",
    )
    p.add_argument(
        "--config", default=None, metavar="PATH",
        help="clusters file (default: trtllm-slurm.toml here, then "
        "~/.config/trtllm-slurm/clusters.toml)",
    )
    p.add_argument("--timeout", type=float, default=30, metavar="SECONDS",
                   help="limit for each command (default 30)")
    p.set_defaults(handler=run_env)


def run_env(args: argparse.Namespace) -> int:
    shell = LocalShell()
    local = probe_local_env(shell, timeout=min(args.timeout, 10))
    partitions = [p.strip() for p in (args.partitions or "").split(",") if p.strip()] or None
    if args.cluster and (args.cluster.lower() != (local.cluster_name or "").lower()):
        return run_remote_env(args, local, partitions)
    client = SlurmClient(shell, timeout=args.timeout)
    tools = client.tools_found()
    slurm = client.discover(partitions) if tools else None
    if args.format == "json":
        print(json.dumps({"local": local.model_dump(mode="json"),
                          "slurm": slurm.model_dump(mode="json") if slurm else None}, indent=2))
    else:
        print(format_env_text(local, slurm))
    if not tools:
        return EXIT_NO_SLURM
    return EXIT_PARTIAL if slurm and slurm.errors else EXIT_OK


def run_remote_env(args: argparse.Namespace, local: LocalEnv,
                   partitions: list[str] | None) -> int:
    """``env --cluster NAME`` for a remote cluster: the same discovery over SSH."""
    from pathlib import Path

    from pytest_trtllm_slurm.execution.remote.clusters import RemoteClusters
    from pytest_trtllm_slurm.planning.settings import load_clusters_file

    clusters = load_clusters_file(Path(args.config) if args.config else None, Path.cwd())
    try:
        cluster = clusters.get(args.cluster)
    except ConfigError as exc:
        raise ConfigError(f"--cluster {args.cluster}: not the local Slurm cluster "
                          f"({local.cluster_name or 'none found here'}) and {exc}") from None
    if not cluster.is_remote:
        raise ConfigError(f"--cluster {args.cluster}: [clusters.{cluster.name}] has no ssh_host "
                          f"and it is not the local Slurm cluster "
                          f"({local.cluster_name or 'none found here'})")
    remotes = RemoteClusters(None, held=getattr(args, "held_code", None))
    try:
        try:
            shell = remotes.shell(cluster)
        except ExecutionError as exc:
            raise ConfigError(str(exc)) from None
        slurm = SlurmClient(shell, timeout=args.timeout).discover(partitions)
    finally:
        remotes.close()
    if args.format == "json":
        print(json.dumps({"cluster": cluster.name, "ssh_host": cluster.ssh_host,
                          "slurm": slurm.model_dump(mode="json")}, indent=2))
    else:
        text = format_env_text(local, slurm).split("\n")
        start = next(i for i, line in enumerate(text) if line.startswith("Slurm"))
        print("\n".join([f"Cluster {cluster.name} over SSH ({cluster.ssh_host}):",
                         *text[start:]]))
    if any(e.startswith("Slurm client tools not found") for e in slurm.errors):
        return EXIT_NO_SLURM
    return EXIT_PARTIAL if slurm.errors else EXIT_OK


def format_env_text(local: LocalEnv, slurm: SlurmEnv | None) -> str:
    """Human-readable env report (the JSON form carries the same fields)."""
    gpus = f"{local.gpu_count} x {local.device_type}" if local.gpu_count else "none"
    slurm_here = f"yes, cluster {local.cluster_name}" if local.slurm_available else "no"
    mem = f", {local.gpu_memory_mib} MiB each" if local.gpu_memory_mib else ""
    lines = [
        "This machine:",
        f"  arch:             {local.arch}",
        f"  GPUs:             {gpus}{mem}",
        f"  container engine: {local.container_engine or 'none'}",
        f"  Slurm:            {slurm_here}",
    ]
    lines += [f"  note: {n}" for n in local.notes]
    if slurm is None:
        lines.append("Slurm: client tools not found")
        return "\n".join(lines)
    lines += [
        f"Slurm {slurm.slurm_version or '?'} cluster {slurm.cluster_name or '?'}:",
        f"  user:     {slurm.user or '?'}",
        f"  accounts: {', '.join(slurm.accounts) or 'none'} (default {slurm.default_account})",
        f"  mpi:      {', '.join(slurm.pmix.available) or 'none'} "
        f"(preferred {slurm.pmix.preferred})",
        "  partitions:",
    ]
    for p in slurm.partitions:
        star = "*" if p.name == slurm.default_partition else " "
        lines.append(
            f"   {star}{p.name:<12} {p.state or '?':<6} {len(p.nodes)} nodes  "
            f"{p.gpus_per_node} x {p.gpu_type or '-'} per node  arch {p.arch or '?'}  "
            f"gres {p.gres or '-'}  max time {p.time_limit or '?'}"
        )
    lines += [f"  error: {e}" for e in slurm.errors]
    return "\n".join(lines)


# --------------------------------------------------------------------------- main

def add_completion(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "completion", help="print a shell completion script",
        description="Print a bash completion script for trtllm-slurm. Load it with "
        "`source <(trtllm-slurm completion bash)` (zsh: run `autoload -U bashcompinit && "
        "bashcompinit` first).")
    p.add_argument("shell", choices=("bash",))
    p.set_defaults(handler=_print_completion)


def _print_completion(args: argparse.Namespace) -> int:
    print(bash_script(build_parser()), end="")
    return EXIT_OK


# a static table made from the parser itself, so it never offers what the CLI lacks
# (argcomplete would import the CLI on every <TAB>)
FUNCTION = "_trtllm_slurm"


def _table(parser: argparse.ArgumentParser, path: str = "",
           out: dict[str, list[str]] | None = None,
           choices: dict[str, list[str]] | None = None
           ) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """``words``: per subcommand path (space separated), what may come next;
    ``choices``: per ``path|option``, the option's fixed values."""
    out = {} if out is None else out
    choices = {} if choices is None else choices
    words: list[str] = []
    for action in parser._actions:  # argparse has no public walk of its actions
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                words.append(name)
                _table(sub, f"{path} {name}".strip(), out, choices)
        elif not action.option_strings and action.choices:  # a positional's fixed values
            words += [str(c) for c in action.choices]
        elif action.option_strings:
            words += [o for o in action.option_strings if o.startswith("--") or len(o) == 2]
            if action.choices:
                for option in action.option_strings:
                    choices[f"{path}|{option}"] = [str(c) for c in action.choices]
    out[path] = sorted(set(words))
    return out, choices


def bash_script(parser: argparse.ArgumentParser, program: str = "trtllm-slurm") -> str:
    words, choices = _table(parser)
    paths = "\n".join(f"        {shlex.quote(p)}) words={shlex.quote(' '.join(w))} ;;"
                      for p, w in sorted(words.items()))
    values = "\n".join(f"        {shlex.quote(k)}) values={shlex.quote(' '.join(v))} ;;"
                       for k, v in sorted(choices.items()))
    known = " ".join(shlex.quote(p) for p in sorted(words) if p)
    return f'''# bash completion for {program} (generated by `{program} completion bash`)
{FUNCTION}() {{
    local cur prev path="" word candidate words="" values=""
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    for word in "${{COMP_WORDS[@]:1:COMP_CWORD-1}}"; do
        candidate="${{path:+$path }}$word"
        for known in {known}; do
            if [ "$candidate" = "$known" ]; then path="$candidate"; break; fi
        done
    done
    case "$path|$prev" in
{values}
    esac
    if [ -n "$values" ]; then
        COMPREPLY=($(compgen -W "$values" -- "$cur"))
        return 0
    fi
    case "$path" in
{paths}
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -o default -F {FUNCTION} {program}
'''


SUBCOMMANDS: list[Adder] = [add_env, add_alloc_parser, add_run_parser, add_completion]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trtllm-slurm", description="pytest-trtllm-slurm helper commands"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    held = otp_env.HeldCode().take_from_environ()  # no job or process it starts inherits it
    args = build_parser().parse_args(argv)
    args.held_code = held  # (the command's own, for its logins: ``auth.otp_provider``)
    try:
        return int(args.handler(args))
    except ConfigError as exc:
        print(f"trtllm-slurm {args.command}: {exc}", file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
