"""Pure resolution of the job's account, partition, container image, build arch, names.

Each value is resolved once here (option/marker > cluster file > discovery or
repo default) and written into job_spec.json; executors never re-resolve.
An explicit value that the cluster does not know is a ConfigError listing the
valid names: submitting it would only fail later, in the queue.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.node.paths import work_root
from pytest_trtllm_slurm.planning.jobspec import PartitionInfo, SlurmEnv
from pytest_trtllm_slurm.planning.models import DeviceRequirement
from pytest_trtllm_slurm.planning.settings import ClusterConfig

IMAGE_TAGS_FILE = Path("jenkins") / "current_image_tags.properties"
X86_IMAGE_KEY = "LLM_DOCKER_IMAGE"
AARCH64_IMAGE_KEY = "LLM_SBSA_DOCKER_IMAGE"

_BUILD_ARCH = {
    "H100": "90-real",
    "H200": "90-real",
    "GH200": "90-real",
    "B200": "100-real",
    "GB200": "100-real",
    "B300": "100-real",
    "GB300": "100-real",
    "A100": "80-real",
    "L40S": "89-real",
}
DEFAULT_BUILD_ARCH = "100-real"


# Words that are vendor/brand prefixes, not part of the device type.
_BRAND_WORDS = {"NVIDIA", "TESLA", "GEFORCE", "QUADRO"}
# A device type token: letters then digits, optional letter suffix (H200, GB200, L40S, A10G).
_TYPE_TOKEN = re.compile(r"^[A-Z]{1,3}\d{1,4}[A-Z]?$")


def normalize_device_type(name: str | None) -> str | None:
    """Marketing GPU name -> short device type (``NVIDIA H100 80GB HBM3`` -> ``H100``).

    Idempotent and case-insensitive (``h200``, a Slurm gres type, -> ``H200``) so that
    names from nvidia-smi, gres.conf, markers and options compare equal.
    """
    if not name or not name.strip():
        return None
    words = [w for w in re.split(r"[\s_]+", name.strip().upper()) if w]
    words = [w for w in words if w not in _BRAND_WORDS] or words
    first = words[0].split("-")[0]  # "A100-SXM4-80GB" -> "A100"
    if _TYPE_TOKEN.match(first):
        return first
    # "RTX 4090", "RTX PRO 6000 Blackwell ...": join words up to the first with a digit.
    picked: list[str] = []
    for word in words:
        picked.append(word.split("-")[0])
        if any(ch.isdigit() for ch in word):
            break
    return "".join(picked)


# --------------------------------------------------------------------------- account


def resolve_account(
    option: str | None, cluster: ClusterConfig | None, slurm_env: SlurmEnv | None
) -> str | None:
    """Account: option > cluster file > discovered default; validated against discovery.

    None when nothing names one and the cluster has no associations (accounting off:
    sbatch then runs without -A). No default while associations exist is an error.
    """
    known = slurm_env.accounts if slurm_env else []
    chosen = option or (cluster.account if cluster else None)
    where = "--slurm-account" if option else "the clusters file"
    if chosen:
        if known and chosen not in known:
            raise ConfigError(
                f"Slurm account {chosen!r} (from {where}) is not one of yours on this cluster; "
                f"valid accounts: {', '.join(known)}"
            )
        return chosen
    if slurm_env and slurm_env.default_account:
        return slurm_env.default_account
    if known:
        raise ConfigError(
            f"no default Slurm account found; choose one of {', '.join(known)} with "
            "--slurm-account NAME (or account = ... in the clusters file)"
        )
    return None


# --------------------------------------------------------------------------- partition


def partition_fits(part: PartitionInfo, req: DeviceRequirement) -> bool:
    """Can one job on ``part`` give ``req`` its GPUs (per node, and enough nodes)?"""
    if req.total == 0:
        return True
    if part.gpus_per_node <= 0:
        return False
    per_node = req.resolve_per_node(part.gpus_per_node)
    if per_node > part.gpus_per_node:
        return False
    return not part.nodes or req.nodes(part.gpus_per_node) <= len(part.nodes)


def device_type_matches(part: PartitionInfo, device_type: str | None) -> bool:
    """True when no type is wanted or the partition's GPU type is that type."""
    if not device_type:
        return True
    return normalize_device_type(part.gpu_type) == normalize_device_type(device_type)


def check_partition_name(name: str, slurm_env: SlurmEnv | None, where: str) -> None:
    """ConfigError when discovery found partitions and ``name`` is not one of them."""
    if slurm_env and slurm_env.partitions and slurm_env.partition(name) is None:
        valid = ", ".join(p.name for p in slurm_env.partitions)
        raise ConfigError(
            f"Slurm partition {name!r} (from {where}) does not exist on this cluster; "
            f"valid partitions: {valid}"
        )


def select_partition(
    req: DeviceRequirement,
    slurm_env: SlurmEnv | None,
    *,
    explicit: str | None = None,
    cluster: ClusterConfig | None = None,
    device_type: str | None = None,
) -> str | None:
    """Partition for ``req``: explicit > cluster file > GPU type match > enough GPUs > default.

    An explicit or cluster-file name is validated (ConfigError when unknown) and returned
    even if it cannot serve ``req`` (the caller reports that). The automatic choices only
    consider partitions that fit (the default partition first among equals); None when
    none does. CPU-only requirements get the default partition.
    """
    if explicit:
        check_partition_name(explicit, slurm_env, "--slurm-partition")
        return explicit
    if cluster and cluster.partition:
        check_partition_name(cluster.partition, slurm_env, "the clusters file")
        return cluster.partition
    if slurm_env is None or not slurm_env.partitions:
        return None
    default = slurm_env.partition(slurm_env.default_partition or "")
    if req.total == 0:  # CPU-only: any partition; the site's default first
        return (default or slurm_env.partitions[0]).name
    if not any(p.gpus_per_node for p in slurm_env.partitions) and slurm_env.errors:
        # Discovery was partial and saw no GPU gres: GPUs cannot be ruled out anywhere.
        return default.name if default else None
    fitting = [p for p in slurm_env.partitions if partition_fits(p, req)]
    if device_type:
        typed = [p for p in fitting if p.gpu_type and device_type_matches(p, device_type)]
        if typed:
            return _prefer_default(typed, slurm_env).name
        # A partition whose gres names no GPU type cannot be ruled out.
        fitting = [p for p in fitting if not p.gpu_type]
    return _prefer_default(fitting, slurm_env).name if fitting else None


def _prefer_default(parts: list[PartitionInfo], slurm_env: SlurmEnv) -> PartitionInfo:
    return next((p for p in parts if p.name == slurm_env.default_partition), parts[0])


def with_cluster_overrides(env: SlurmEnv, cluster: ClusterConfig) -> SlurmEnv:
    """Discovery with the clusters file's word on top: its ``gpus_per_node`` and
    ``device_type`` replace what was found for its partition (every partition when it
    names none), so a site whose gres discovery cannot read is still sized right."""
    if not (cluster.gpus_per_node or cluster.device_type):
        return env
    update: dict[str, object] = {}
    if cluster.gpus_per_node:
        update["gpus_per_node"] = cluster.gpus_per_node
    if cluster.device_type:
        update["gpu_type"] = cluster.device_type
    parts = [p.model_copy(update=update) if not cluster.partition or p.name == cluster.partition
             else p for p in env.partitions]
    return env.model_copy(update={"partitions": parts})


def resolve_partition(
    req: DeviceRequirement,
    option: str | None,
    cluster: ClusterConfig | None,
    slurm_env: SlurmEnv | None,
    device_type: str | None = None,
) -> str:
    """Like select_partition, but a job must have one: ConfigError naming the choices."""
    name = select_partition(
        req, slurm_env, explicit=option, cluster=cluster, device_type=device_type
    )
    if name:
        return name
    valid = ", ".join(p.name for p in slurm_env.partitions) if slurm_env else ""
    raise ConfigError(
        "no Slurm partition could be chosen"
        + (f" for {describe_requirement(req, device_type)}" if req.total else "")
        + (f"; valid partitions: {valid}" if valid else "; partition discovery found none")
        + "; choose one with --slurm-partition NAME (or partition = ... in the clusters file)"
    )


def describe_requirement(req: DeviceRequirement, device_type: str | None = None) -> str:
    """``8 GPUs (4 per node, H200, from skip_less_device)`` for messages."""
    if req.total == 0:
        return "no GPUs"
    bits = [f"{req.per_node} per node" if req.per_node else "any per node"]
    dtype = device_type or req.device_type
    if dtype:
        bits.append(dtype)
    if req.device_memory_mib:
        bits.append(f">= {req.device_memory_mib} MiB each")
    bits.append(f"from {req.source}")
    return f"{req.total} GPU{'s' if req.total != 1 else ''} ({', '.join(bits)})"


# --------------------------------------------------------------------------- image


def read_image_tags(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines (``#`` comments, optional ``export``, optional quotes) -> dict."""
    out: dict[str, str] = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        line = line.removeprefix("export ").strip()
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def target_arch(device_type: str | None, arch: str | None = None) -> str:
    """CPU arch of the machine that runs the job: a known ``arch`` wins, else GB*/GH* -> aarch64."""
    if arch:
        low = arch.lower()
        if low in ("aarch64", "arm64", "sbsa"):
            return "aarch64"
        if low in ("x86_64", "amd64"):
            return "x86_64"
    dtype = normalize_device_type(device_type) or ""
    return "aarch64" if dtype.startswith(("GB", "GH")) else "x86_64"


def resolve_container_image(
    option: str | None,
    cluster: ClusterConfig | None,
    rootdir: Path,
    *,
    device_type: str | None = None,
    arch: str | None = None,
) -> str | None:
    """Image URI: option/marker > cluster file > ``jenkins/current_image_tags.properties``.

    The properties key follows the target arch (``LLM_SBSA_DOCKER_IMAGE`` for aarch64).
    Stored canonical (no enroot ``#``); None when no source names one.
    """
    if option:
        return option
    if cluster and cluster.container_image:
        return cluster.container_image
    tags_path = rootdir / IMAGE_TAGS_FILE
    if not tags_path.is_file():
        return None
    key = AARCH64_IMAGE_KEY if target_arch(device_type, arch) == "aarch64" else X86_IMAGE_KEY
    image = read_image_tags(tags_path).get(key)
    if not image:
        raise ConfigError(
            f"{tags_path} has no {key}=... line for {target_arch(device_type, arch)}; "
            "pass --trtllm-container-image URI or add the key"
        )
    return image


def enroot_uri(image: str) -> str:
    """Canonical ``registry.example/ns/img:tag`` -> enroot/pyxis ``registry.example#ns/img:tag``.

    Only a first component that is a registry host (has ``.`` or ``:``, or is
    ``localhost``) is rewritten; Docker Hub names and already-rewritten URIs are kept.
    """
    scheme = ""
    rest = image
    if "://" in image:
        scheme, _, rest = image.partition("://")
        scheme += "://"
    if "#" in rest or "/" not in rest:
        return image
    host, _, path = rest.partition("/")
    if "." in host or ":" in host or host == "localhost":
        return f"{scheme}{host}#{path}"
    return image


# --------------------------------------------------------------------------- names


def build_arch(device_type: str | None) -> str:
    """CUDA arch for the build (``-a``): H100/H200 90-real, Blackwell 100-real, ..."""
    return _BUILD_ARCH.get(normalize_device_type(device_type) or "", DEFAULT_BUILD_ARCH)


def _safe_name(text: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._")
    return cleaned or "job"


def job_name(account: str | None, detail: str) -> str:
    """``<account>.<detail>`` (the cluster's job-name convention); ``<detail>`` without account."""
    detail = _safe_name(detail)
    return f"{account}.{detail}" if account else detail


def work_dir(
    rootdir: Path, name: str, *, root: str | None = None, now: datetime | None = None
) -> Path:
    """``<rootdir>/work_dirs/<name>_<YYYYmmdd_HHMMSS>``; ``root`` (settings.work_dir) replaces
    ``<rootdir>/work_dirs`` (the plugin's work root)."""
    stamp = (now or datetime.now()).strftime("%Y%m%d_%H%M%S")
    base = Path(root).expanduser() if root else work_root(None, rootdir).dir
    return base / f"{_safe_name(name)}_{stamp}"
