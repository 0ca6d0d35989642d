"""Containers, rendered: pure functions shared by the local docker/podman executor and the
Slurm scripts (no I/O, no subprocess; snapshot-testable). A batch inside any container
sees the repo, the invocation dir and the work dir at their host paths (the worker's argv
names them) and this plugin read-only at ``PLUGIN_ROOT`` (images have pytest, not it)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Literal

from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.resolve import enroot_uri
from pytest_trtllm_slurm.planning.safe_values import argument_problem, line_problem, mount_problem
from pytest_trtllm_slurm.planning.settings import mount_target

Engine = Literal["docker", "podman"]

#: where the plugin package is mounted inside containers (on PYTHONPATH)
PLUGIN_ROOT = "/opt/trtllm-slurm"
#: the docker/podman label every container of ours carries (value: the owner tag)
OWNER_LABEL = "trtllm-slurm.owner"
JOB_LABEL = "trtllm-slurm.job"

_NAME_BAD = re.compile(r"[^A-Za-z0-9_.-]+")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# variables that would change the engine CLI itself if set in ITS environment: passed in an
# env file instead (--env-file: a pipe, so the values are neither in ps nor on disk); all
# others as -e NAME, the value in the CLI's environment
_CLIENT_NAMES = {"PATH", "HOME", "TMPDIR", "LD_PRELOAD", "LD_LIBRARY_PATH", "XDG_RUNTIME_DIR",
                 "XDG_CONFIG_HOME", "XDG_DATA_HOME", "SSL_CERT_FILE", "HTTP_PROXY",
                 "HTTPS_PROXY", "NO_PROXY"}
#: prefix under which a Slurm task's CLI-sensitive variables reach the container wrapper
CENV_PREFIX = "TRTLLM_SLURM_CENV_"
_CLIENT_PREFIXES = ("DOCKER_", "CONTAINERS_", "CONTAINER_", "PODMAN_", "BUILDAH_", "REGISTRY_")


def client_sensitive(name: str) -> bool:
    """True for env names the docker/podman CLI reads itself (never put in its environment)."""
    upper = name.upper()
    return upper in _CLIENT_NAMES or upper.startswith(_CLIENT_PREFIXES)


def env_file_text(env: Mapping[str, str]) -> str:
    """``NAME=VALUE`` lines of docker/podman's ``--env-file`` (read as they are: no quotes,
    no expansion). A value with a newline cannot be written there: ValueError naming it."""
    lines = []
    for name, value in sorted(env.items()):
        _check_name(name)
        if "\n" in value or "\r" in value or "\0" in value:
            raise ValueError(f"environment variable {name}: its value holds a line break or "
                             "NUL, which an engine's --env-file cannot carry; remove it")
        lines.append(f"{name}={value}\n")
    return "".join(lines)


def _check_name(name: str) -> None:
    if not _ENV_NAME.match(name):
        raise ValueError(f"environment variable name {name!r} is not a valid name")


def plugin_dir() -> str:
    """The host directory of this package (mounted read-only into containers)."""
    return str(Path(__file__).resolve().parents[2])  # pytest_trtllm_slurm/


def safe_name(text: str, limit: int = 63) -> str:
    """A docker/podman/enroot-safe name: ``[A-Za-z0-9][A-Za-z0-9_.-]*``, at most ``limit``."""
    cleaned = _NAME_BAD.sub("_", text).strip("._-")[:limit].rstrip("._-")
    return cleaned or "trtllm"


def container_name_for(image: str, *, account: str | None = None, salt: str = "") -> str:
    """pyxis container name for ``image``: ``<account|trtllm>-<image slug>-<hash>``, the hash
    over the image and ``salt`` (the install command): a changed image is a new container."""
    canonical = image.removeprefix("docker://").replace("#", "/")
    digest = hashlib.sha256(f"{canonical}\0{salt}".encode()).hexdigest()[:10]
    last = canonical.rsplit("/", 1)[-1]
    return safe_name(f"{account or 'trtllm'}-{safe_name(last, 32)}-{digest}")


def parse_mount(text: str) -> tuple[str, str, str]:
    """``SRC[:DST[:FLAGS]]`` -> (src, dst, flags); DST defaults to SRC."""
    if problem := mount_problem(text):
        raise ValueError(f"mount {text!r} {problem}; expected SRC[:DST[:FLAGS]] with "
                         "absolute paths")
    parts = text.split(":")
    src = parts[0]
    dst = parts[1] if len(parts) > 1 and parts[1] else src
    flags = parts[2] if len(parts) > 2 else ""
    return src, dst, flags


def _mount(src: str, dst: str | None = None, flags: str = "") -> str:
    dst = dst or src
    for path in (src, dst):
        if any(c in path for c in ":,") or line_problem(path):
            raise ValueError(
                f"path {path!r} cannot be mounted into a container: it contains ':' or ',' "
                "(the separators of docker -v and pyxis --container-mounts) or a line break; "
                "use another path")
    return f"{src}:{dst}" + (f":{flags}" if flags else "")


def _under(path: str, parent: str) -> bool:
    p, q = PurePosixPath(path), PurePosixPath(parent)
    return p == q or q in p.parents


def job_mounts(spec: JobSpec, *, models_root: str | None = None) -> list[str]:
    """Mounts a batch needs, ``SRC:DST[:ro]`` (docker -v and pyxis alike), none inside an
    earlier one; the JobSpec's own mounts last, as given, each container path once."""
    out: list[str] = []
    seen: list[str] = []
    for path in (spec.rootdir, spec.invocation_dir, spec.work_dir):
        if path and not any(_under(path, s) for s in seen):
            seen.append(path)
            out.append(_mount(path))
    own = {mount_target(m).rstrip("/") for m in spec.mounts}
    if (models_root and not any(_under(models_root, s) for s in seen)
            and models_root.rstrip("/") not in own):
        out.append(_mount(models_root, flags="ro"))
    taken = {mount_target(m).rstrip("/") for m in out}
    for text in spec.mounts:
        parse_mount(text)  # validated, passed through unchanged
        target = mount_target(text).rstrip("/")
        if target not in taken:
            taken.add(target)
            out.append(text)
    out.append(_mount(plugin_dir(), f"{PLUGIN_ROOT}/pytest_trtllm_slurm", "ro"))
    return out


def container_env(spec: JobSpec) -> dict[str, str]:
    """The job's environment in a container: spec.env, PYTHONPATH with the plugin root first."""
    env = dict(spec.env)
    for name in env:
        _check_name(name)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = PLUGIN_ROOT + (f":{old}" if old else "")
    return env


def in_container_argv(command: Sequence[str]) -> list[str]:
    """The worker argv, a Python interpreter first replaced by the image's ``python3``."""
    argv = list(command)
    if argv and re.fullmatch(r"python[0-9.]*", PurePosixPath(argv[0]).name):
        argv[0] = "python3"
    return argv


def workdir_of(spec: JobSpec) -> str:
    return spec.invocation_dir or spec.rootdir


def pyxis_args(spec: JobSpec, container_name: str, *, writable: bool = False,
               mounts: Sequence[str] | None = None, workdir: str | None = None,
               env_names: Sequence[str] | None = None) -> list[str]:
    """pyxis flags for one srun of ``spec``, the image in enroot's form. ``env_names``
    None: those of ``container_env(spec)`` (pyxis lets the image's values win unless a name
    is in --container-env); the caller exports ``container_env(spec)`` before srun."""
    if not spec.container_image:
        raise ValueError(f"job spec {spec.name!r} has no container image")
    mounts = list(job_mounts(spec) if mounts is None else mounts)
    names = sorted(container_env(spec)) if env_names is None else list(env_names)
    out = [f"--container-image={enroot_uri(spec.container_image)}",
           f"--container-name={container_name}"]
    if mounts:
        out.append("--container-mounts=" + ",".join(mounts))
    out.append(f"--container-workdir={workdir or workdir_of(spec)}")
    if writable:
        out.append("--container-writable")
    if names:
        out.append("--container-env=" + ",".join(names))
    return out


def pyxis_setup_argvs(job_id: str, nodes: int, image: str, container_name: str,
                      mounts: Sequence[str] = (), install_command: str | None = None,
                      workdir: str | None = None) -> list[list[str]]:
    """A persistent allocation's setup steps, a task per node: import the image as
    ``container_name``, ``ls`` every mount target, then ``install_command`` (writable)."""
    base = ["srun", f"--jobid={job_id}", "-N", str(nodes), "--ntasks-per-node=1", "--overlap"]
    steps = [base + [f"--container-image={enroot_uri(image)}",
                     f"--container-name={container_name}", "true"]]
    mounted = ["--container-mounts=" + ",".join(mounts)] if mounts else []
    targets = [parse_mount(m)[1] for m in mounts]
    if targets:
        warm = 'for p in "$@"; do ls "$p" > /dev/null 2>&1; done; true'
        steps.append(base + [f"--container-name={container_name}", *mounted,
                             "sh", "-c", warm, "warm", *targets])
    if install_command:
        wd = [f"--container-workdir={workdir}"] if workdir else []
        steps.append(base + [f"--container-name={container_name}", "--container-writable",
                             *mounted, *wd, "sh", "-c", install_command])
    return steps


def positional_image(image: str | None, what: str) -> str:
    """``image`` as a positional argument (one starting with ``-`` would be an option)."""
    if not image:
        raise ValueError(f"job spec {what!r} has no container image")
    if problem := argument_problem(image):
        raise ValueError(f"container image {image!r} {problem}")
    return image


def gpu_flags(engine: Engine, gpu_ids: Sequence[int] | None, all_gpus: bool = False) -> list[str]:
    """``--gpus all`` / ``--gpus "device=0,1"`` (docker), CDI devices (podman); none for CPU."""
    if all_gpus:
        return ["--gpus", "all"] if engine == "docker" else ["--device", "nvidia.com/gpu=all"]
    if not gpu_ids:
        return []
    if engine == "docker":
        return ["--gpus", '"device=' + ",".join(map(str, gpu_ids)) + '"']
    return [arg for i in gpu_ids for arg in ("--device", f"nvidia.com/gpu={i}")]


def engine_run_argv(engine: Engine, spec: JobSpec, *, name: str, cli: Sequence[str] | None = None,
                    image: str | None = None, run_flags: Sequence[str] = (),
                    gpu_ids: Sequence[int] | None = None, all_gpus: bool = False,
                    mounts: Sequence[str] | None = None, env: Mapping[str, str] | None = None,
                    env_file: str | None = None, user: str | None = None,
                    labels: Mapping[str, str] | None = None,
                    command: Sequence[str] | None = None) -> list[str]:
    """``<engine> run --rm --name NAME --pull=never ... IMAGE <worker argv>`` for one batch.
    No value on the command line: ``-e NAME`` (from the engine's environment), and the
    names the CLI reads itself (``client_sensitive``) from ``env_file`` (a pipe)."""
    img = positional_image(image or spec.container_image, spec.name)
    argv = [*(cli or [engine]), "run", "--rm", "--name", name, "--pull=never",
            *_run_options(labels, run_flags)]
    argv += gpu_flags(engine, gpu_ids, all_gpus)
    if user:
        argv += ["--user", user]
    for m in job_mounts(spec) if mounts is None else mounts:
        argv += ["-v", m]
    argv += ["-w", workdir_of(spec)]
    names = sorted(container_env(spec) if env is None else env)
    in_file = [name for name in names if client_sensitive(name)]
    if in_file:
        if not env_file:
            raise ValueError(f"{', '.join(in_file)} must reach the container through an env "
                             "file (the engine CLI reads them itself): pass env_file")
        argv += ["--env-file", env_file]
    for name in names:
        if not client_sensitive(name):
            argv += ["-e", name]
    argv.append(img)
    return argv + in_container_argv(spec.command if command is None else command)


def _run_options(labels: Mapping[str, str] | None, run_flags: Sequence[str]) -> list[str]:
    """The labels, the host's network and the flags of a ``run``, in that order."""
    out = [arg for key, value in sorted((labels or {}).items())
           for arg in ("--label", f"{key}={value}")]
    return [*out, "--network=host", *run_flags]


# the bash script behind ``wrap_in_container`` (also written to a file: its ``script``)
WRAPPER_SCRIPT = r"""# pytest-trtllm-slurm: one Slurm task run in a docker/podman container
# args: NAME_PREFIX NCLI ENGINE GPUS(gpus|none) CLI... RUN_ARGS... IMAGE COMMAND...
prefix=$1; ncli=$2; engine=$3; gpus=$4; shift 4
cli=("${@:1:$ncli}"); shift "$ncli"
name="$prefix-${SLURM_JOB_ID:-$$}.${SLURM_STEP_ID:-0}.${SLURM_PROCID:-0}"
extra=()
ids=${SLURM_STEP_GPUS:-${SLURM_JOB_GPUS:-}}
if [ "$gpus" = gpus ]; then
  if [ -z "$ids" ]; then
    if [ "$engine" = podman ]; then extra=(--device nvidia.com/gpu=all); else extra=(--gpus all); fi
  else
    if [ "$engine" = podman ]; then
      for i in ${ids//,/ }; do extra+=(--device "nvidia.com/gpu=$i"); done
    else extra=(--gpus "\"device=$ids\""); fi
    # the engine exposes exactly these GPUs, renumbered from 0
    n=0; cvd=""; for i in ${ids//,/ }; do cvd="$cvd${cvd:+,}$n"; n=$((n + 1)); done
    extra+=(-e "CUDA_VISIBLE_DEVICES=$cvd")
  fi
fi
# docker: the task's user, not root, owns what the test writes (rootless podman maps root)
uid=$(id -u)
if [ "$engine" = docker ] && [ "$uid" != 0 ]; then extra+=(--user "$uid:$(id -g)"); fi
# variables the engine CLI reads itself arrive as TRTLLM_SLURM_CENV_<NAME>: the container
# gets them through --env-file, a pipe (neither in ps nor on disk), the CLI never sees them
cenv=""
for v in $(compgen -e); do
  case "$v" in TRTLLM_SLURM_CENV_*) cenv+="${v#TRTLLM_SLURM_CENV_}=${!v}"$'\n'; unset "$v" ;; esac
done
rmflags=(-f); if [ "$engine" = podman ]; then rmflags+=(--time 0); fi
cleanup() { "${cli[@]}" rm "${rmflags[@]}" "$name" >/dev/null 2>&1; }
trap 'cleanup; exit 143' TERM INT HUP
"${cli[@]}" run --name "$name" --env-file <(printf '%s' "$cenv") "${extra[@]}" "$@" &
wait "$!"
rc=$?
cleanup
exit "$rc"
"""


def wrap_in_container(argv: Sequence[str], runtime: Engine, image: str, *,
                      name_prefix: str = "trtllm", cli: Sequence[str] | None = None,
                      mounts: Sequence[str] = (), workdir: str | None = None,
                      env_names: Sequence[str] = (), gpus: bool = False,
                      run_flags: Sequence[str] = (),
                      labels: Mapping[str, str] | None = None,
                      script: str | None = None) -> list[str]:
    """A Slurm task ``argv`` run inside ``image`` with docker or podman (``bash -c WRAPPER``,
    or ``bash SCRIPT`` holding it; see ``WRAPPER_SCRIPT``)."""
    cli = list(cli or [runtime])
    image = positional_image(image, name_prefix)
    run = ["--rm", "--pull=never", *_run_options(labels, run_flags)]
    for m in mounts:
        parse_mount(m)
        run += ["-v", m]
    if workdir:
        run += ["-w", workdir]
    for name in env_names:
        _check_name(name)
        run += ["-e", name]
    run.append(image)
    head = ["bash", script] if script else ["bash", "-c", WRAPPER_SCRIPT, "trtllm-container"]
    return [*head, safe_name(name_prefix, 40), str(len(cli)), runtime,
            "gpus" if gpus else "none", *cli, *run, *argv]
