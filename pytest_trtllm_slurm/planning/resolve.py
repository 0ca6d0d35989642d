"""Pure resolution of a job's device type name, container image, build arch and names:
once, here, into job_spec.json, so executors never re-resolve."""

from __future__ import annotations

import re
from pathlib import Path

from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.planning.settings import ClusterConfig

IMAGE_TAGS_FILE = Path("jenkins") / "current_image_tags.properties"
X86_IMAGE_KEY = "LLM_DOCKER_IMAGE"
AARCH64_IMAGE_KEY = "LLM_SBSA_DOCKER_IMAGE"

_BUILD_ARCH = {"H100": "90-real", "H200": "90-real", "GH200": "90-real", "B200": "100-real",
               "GB200": "100-real", "B300": "100-real", "GB300": "100-real", "A100": "80-real",
               "L40S": "89-real"}
DEFAULT_BUILD_ARCH = "100-real"


# Words that are vendor/brand prefixes, not part of the device type.
_BRAND_WORDS = {"NVIDIA", "TESLA", "GEFORCE", "QUADRO"}
# A device type token: letters then digits, optional letter suffix (H200, GB200, L40S, A10G).
_TYPE_TOKEN = re.compile(r"^[A-Z]{1,3}\d{1,4}[A-Z]?$")


def normalize_device_type(name: str | None) -> str | None:
    """Marketing GPU name -> short device type (``NVIDIA H100 80GB HBM3`` -> ``H100``),
    idempotent and case-insensitive, so nvidia-smi, gres, markers and options compare equal."""
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
    """Image URI: option/marker > cluster file > ``jenkins/current_image_tags.properties``
    (its key by arch: ``LLM_SBSA_DOCKER_IMAGE`` for aarch64); canonical, or None."""
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
    """Canonical ``registry.example/ns/img:tag`` -> enroot/pyxis ``registry.example#ns/img:tag``
    (only a registry host is rewritten: Docker Hub names and rewritten URIs are kept)."""
    scheme, sep, rest = image.partition("://") if "://" in image else ("", "", image)
    if "#" in rest or "/" not in rest:
        return image
    host, _, path = rest.partition("/")
    if "." in host or ":" in host or host == "localhost":
        return f"{scheme}{sep}{host}#{path}"
    return image


def build_arch(device_type: str | None) -> str:
    """CUDA arch for the build (``-a``): H100/H200 90-real, Blackwell 100-real, ..."""
    return _BUILD_ARCH.get(normalize_device_type(device_type) or "", DEFAULT_BUILD_ARCH)
