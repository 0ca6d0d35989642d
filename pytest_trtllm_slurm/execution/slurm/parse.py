"""Pure parsers for Slurm command output (scontrol, sacctmgr, srun --mpi=list, sinfo):
captured strings in, so samples and the real cluster's output test them alike."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from pytest_trtllm_slurm.planning.jobspec import PartitionInfo, PmixInfo

# Node Features that name a CPU architecture (value: canonical arch).
_ARCH_FEATURES = {"x86_64": "x86_64", "amd64": "x86_64", "x86": "x86_64",
                  "aarch64": "aarch64", "arm64": "aarch64", "sbsa": "aarch64"}

_KEY_RE = re.compile(r"(?:^|\s)([A-Za-z][\w/:.\[\]-]*)=")


@dataclass
class NodeInfo:
    """The few fields of ``scontrol show node -o`` that discovery needs."""

    name: str
    arch: str | None = None
    features: list[str] = field(default_factory=list)
    gres: str | None = None
    gpu_type: str | None = None
    gpus: int = 0
    state: str | None = None
    partitions: list[str] = field(default_factory=list)


def parse_key_values(line: str) -> dict[str, str]:
    """``Key=Value Key2=Value with spaces`` (one ``scontrol -o`` record) -> dict; a value
    runs until the next `` Key=`` (``OS=Linux 6.1 #1 SMP``, ``TRES=cpu=4,mem=4000M``)."""
    matches = list(_KEY_RE.finditer(line))
    out: dict[str, str] = {}
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        out[m.group(1)] = line[m.end() : end].strip()
    return out


def parse_records(text: str) -> list[dict[str, str]]:
    """All one-line records of ``scontrol show <entity> -o``."""
    return [parse_key_values(line) for line in text.splitlines() if "=" in line]


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets/parentheses (``n[1-2,5],g1`` -> 2 parts)."""
    parts: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth = max(0, depth - 1)
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist (``n[01-03,7],g1``, ``r[1-2]-n[1-2]``) keeping zero padding."""
    if not expr or expr in ("(null)", "None"):
        return []
    return [host for part in split_top_level(expr) for host in _expand_one(part)]


def _expand_one(part: str) -> list[str]:
    start = part.find("[")
    if start < 0:
        return [part]
    end = part.find("]", start)
    if end < 0:
        return [part]
    prefix, body, rest = part[:start], part[start + 1 : end], part[end + 1 :]
    tails = _expand_one(rest)
    out: list[str] = []
    for rng in body.split(","):
        lo, _, hi = rng.partition("-")
        if not hi:
            values = [lo]
        else:
            width = len(lo) if lo.startswith("0") else 0
            values = [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
        out.extend(prefix + v + t for v in values for t in tails)
    return out


def parse_gres(gres: str | None) -> tuple[str | None, int]:
    """GPU type (Slurm's spelling: ``--gres=gpu:<type>:N`` uses it verbatim) and count of
    one node's Gres (``gpu:h200:4(S:0-1),nic:2`` -> ("h200", 4)); no GPU -> (None, 0)."""
    if not gres or gres in ("(null)", "N/A"):
        return None, 0
    gpu_type: str | None = None
    total = 0
    for item in split_top_level(gres):
        item = re.sub(r"\(.*\)$", "", item)  # drop socket binding "(S:0-1)"
        fields = item.split(":")
        if fields[0] != "gpu":
            continue
        count_text = fields[-1] if len(fields) > 1 else "1"
        if not count_text.isdigit():  # "gpu:h200" (count omitted) means 1
            gpu_type = gpu_type or count_text
            total += 1
            continue
        total += int(count_text)
        if len(fields) >= 3 and gpu_type is None:
            gpu_type = fields[1]
    return gpu_type, total


def _arch(features: Iterable[str], arch: str | None) -> str | None:
    """The CPU arch a node Feature names, else its ``Arch`` (``arm64`` -> ``aarch64``)."""
    named = next((a for f in features if (a := _ARCH_FEATURES.get(f.strip().lower()))), None)
    if named or not arch or arch in ("(null)", "N/A"):
        return named
    return _ARCH_FEATURES.get(arch.lower(), arch)


def parse_nodes(text: str) -> list[NodeInfo]:
    """``scontrol show node -o`` -> NodeInfo list."""
    nodes: list[NodeInfo] = []
    for rec in parse_records(text):
        name = rec.get("NodeName")
        if not name:
            continue
        feats_raw = rec.get("AvailableFeatures") or rec.get("ActiveFeatures") or ""
        features = [f for f in feats_raw.split(",") if f and f != "(null)"]
        gres = rec.get("Gres")
        gpu_type, gpus = parse_gres(gres)
        parts_raw = rec.get("Partitions", "")
        nodes.append(NodeInfo(
            name=name, arch=_arch(features, rec.get("Arch")),
            features=features, gres=gres if gres and gres != "(null)" else None,
            gpu_type=gpu_type, gpus=gpus, state=rec.get("State"),
            partitions=[p for p in parts_raw.split(",") if p and p != "(null)"]))
    return nodes


def partitions_from_records(
    records: list[dict[str, str]], nodes: list[NodeInfo] | None = None
) -> list[PartitionInfo]:
    """``scontrol show partition -o`` records (+ the nodes) -> PartitionInfo list:
    ``gpus_per_node`` is the largest node's; ``arch`` and ``gres`` the first GPU node's."""
    by_name = {n.name: n for n in nodes or []}
    out: list[PartitionInfo] = []
    for rec in records:
        name = rec.get("PartitionName")
        if not name:
            continue
        node_names = expand_hostlist(rec.get("Nodes", ""))
        members = [by_name[n] for n in node_names if n in by_name]
        gpu_nodes = [n for n in members if n.gpus > 0]
        rep = gpu_nodes[0] if gpu_nodes else (members[0] if members else None)
        out.append(PartitionInfo(
            name=name, state=(rec.get("State") or "").lower() or None,
            time_limit=rec.get("MaxTime"), nodes=node_names, arch=rep.arch if rep else None,
            gres=rep.gres if rep and gpu_nodes else None,
            gpu_type=rep.gpu_type if rep and gpu_nodes else None,
            gpus_per_node=max((n.gpus for n in gpu_nodes), default=0),
            requires_gres=bool(gpu_nodes), default=rec.get("Default", "").upper() == "YES"))
    return out


def parse_scontrol_config(text: str) -> dict[str, str]:
    """``scontrol show config`` (``Key = Value`` lines) -> dict."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


def parse_version(text: str) -> str | None:
    """``sinfo --version`` (``slurm-wlm 22.05.8`` / ``slurm 23.02.1``) -> ``22.05.8``."""
    m = re.search(r"(\d+\.\d+(?:\.\d+)?\S*)", text)
    return m.group(1) if m else None


def parse_mpi_list(text: str) -> PmixInfo:
    """``srun --mpi=list`` (stdout or stderr; the layout varies by version) -> PmixInfo
    (preferred: the newest ``pmix_vN``, else ``pmix``, else ``pmi2``, else None)."""
    names: list[str] = []
    for line in text.splitlines():
        low = line.strip().lower()
        if low.startswith("srun:"):  # older releases prefix every line
            low = low[len("srun:") :].strip()
        if not low or low.startswith("mpi "):  # "MPI plugin types are..."
            continue
        head, colon, tail = low.partition(":")
        if colon and ("available" in head or "version" in head):
            # "specific pmix plugin versions available: pmix_v4,pmix_v5"
            names.extend(t for t in re.split(r"[\s,]+", tail) if t)
            continue
        token = low.split()[0].removeprefix("mpi/")
        if re.fullmatch(r"[a-z][a-z0-9_]*", token):
            names.append(token)
    available = list(dict.fromkeys(names))
    versioned = sorted((n for n in available if re.fullmatch(r"pmix_v\d+", n)),
                       key=lambda n: int(n.removeprefix("pmix_v")))
    preferred = versioned[-1] if versioned else next(
        (name for name in ("pmix", "pmi2") if name in available), None)
    return PmixInfo(available=available, preferred=preferred)


def parse_accounts(text: str, cluster: str | None = None) -> tuple[str | None, list[str]]:
    """(default account, accounts in first-seen order) from ``sacctmgr ... withassoc``;
    only ``cluster``'s rows when known."""
    default: str | None = None
    accounts: list[str] = []
    for line in text.splitlines():
        cols = line.strip().split("|")
        if len(cols) < 4 or not cols[0]:
            continue
        _user, dflt, row_cluster, account = cols[:4]
        if cluster and row_cluster and row_cluster.lower() != cluster.lower():
            continue
        default = default or dflt or None
        if account and account not in accounts:
            accounts.append(account)
    return default, accounts
