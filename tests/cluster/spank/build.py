"""Build and install the pyxis TEST DOUBLE (pyxis_double.c) for the dev cluster.

Called by tests/cluster/up: ``stale()`` on its fast path (cheap: a hash and two small
files), ``ensure()`` when bringing the cluster up. The plugin is compiled with gcc against
/usr/include/slurm/spank.h (Debian: libslurm-dev) into <state>/spank/pyxis_double.so and
listed in /etc/slurm/plugstack.conf.d/pyxis-test-double.conf (Debian's plugstack.conf
includes that directory; pyxis itself is installed the same way) as "required" (SPANK
ignores the errors of an optional plugin; a step whose container cannot be set up must
fail). It is listed only after it compiled, so a broken build never breaks srun: the double
is then missing and srun rejects --container-image. srun and slurmstepd read plugstack.conf
at every start; slurmd only at its start (the job-epilog hook that removes a job's named
containers), so `up` restarts the slurmds when the listing changes.

Measured: gcc 0.2-0.4 s; the fast-path check well under 1 ms.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess

HERE = pathlib.Path(__file__).resolve().parent
SOURCE = HERE / "pyxis_double.c"
PLUGSTACK = pathlib.Path("/etc/slurm/plugstack.conf")
PLUGSTACK_D = pathlib.Path("/etc/slurm/plugstack.conf.d")
CONF = PLUGSTACK_D / "pyxis-test-double.conf"
HEADER = pathlib.Path("/usr/include/slurm/spank.h")


def paths(state: pathlib.Path) -> dict[str, pathlib.Path]:
    base = state / "pyxis"
    return {"so": state / "spank" / "pyxis_double.so", "stamp": state / "spank" / "source.sha256",
            "unavailable": state / "spank" / "unavailable",
            "images": base / "images", "state": base / "state",
            "import_log": base / "state" / "import.log"}


def _conf(state: pathlib.Path, marker: str) -> str:
    p = paths(state)
    # system mounts (like enroot's mounts.d): the cluster's TaskProlog runs inside the
    # container (slurmstepd runs it after the SPANK task hooks), and it puts the fake
    # nvidia-smi on PATH
    system = ",".join(str(state / d) for d in ("etc", "fakebin"))
    return (f"{marker}\n# pyxis TEST DOUBLE (tests/cluster/spank/pyxis_double.c): not NVIDIA's "
            "pyxis; for the test suite only.\n"
            f"required {p['so']} images={p['images']} state={p['state']} mounts={system}\n")


def _digest() -> str:
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()


def stale(state: pathlib.Path, marker: str) -> str | None:
    """Why the double must be (re)built or (re)listed; None when it is current."""
    p = paths(state)
    try:  # a build that failed for this source is not retried by every `up` (delete the file)
        if p["unavailable"].read_text().split("\n", 1)[0] == _digest():
            return None
    except OSError:
        pass
    try:
        if p["stamp"].read_text().strip() != _digest() or not p["so"].exists():
            return "pyxis test double not built or out of date"
        if CONF.read_text() != _conf(state, marker):
            return f"{CONF} missing or out of date"
    except OSError:
        return "pyxis test double not installed"
    if not (p["images"].is_dir() and p["state"].is_dir()):
        return "pyxis test double directories missing"
    return None


def _install_packages(log) -> bool:
    """libslurm-dev and gcc, through the suite's one package list (tests/cluster/debian.py)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "trtllm_tests_debian", pathlib.Path(__file__).resolve().parent.parent / "debian.py")
    debian = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(debian)
    try:
        debian.ensure("spank", log=log)
    except debian.PackagesMissing as e:
        log(f"pyxis test double: {e}")
        return False
    return HEADER.exists() and bool(shutil.which("gcc"))


def ensure(state: pathlib.Path, marker: str, log) -> str:
    """Build, install and list the double (idempotent). Returns "new" when plugstack.conf.d
    changed (slurmd reads it only at start: restart slurmd for the job-epilog hook), "ok"
    when current, "" (logged) when the double cannot be built here."""
    if stale(state, marker) is None:
        return "ok"
    p = paths(state)
    for d in (p["so"].parent, p["images"], p["state"]):
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o755)
    digest = _digest()
    try:
        current = p["stamp"].read_text().strip() == digest and p["so"].exists()
    except OSError:
        current = False
    def unavailable(why: str) -> str:
        p["unavailable"].write_text(f"{digest}\n{why}\n")
        log(f"pyxis test double unavailable ({why}); delete {p['unavailable']} to retry")
        return ""

    if not current:
        if not _install_packages(log):
            return unavailable(f"{HEADER} or gcc missing")
        tmp = p["so"].with_name(f".pyxis_double.so.{os.getpid()}")
        r = subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Wno-format-truncation",
                            "-o", str(tmp), str(SOURCE)], capture_output=True, text=True,
                           timeout=120)
        if r.returncode != 0:
            tmp.unlink(missing_ok=True)
            return unavailable(f"gcc failed:\n{r.stderr[-3000:]}")
        os.replace(tmp, p["so"])  # a new inode: running slurmstepds keep the old mapping
        p["stamp"].write_text(digest + "\n")
        log(f"pyxis test double: built {p['so']}")
    if not PLUGSTACK.exists():
        PLUGSTACK.write_text(f"{marker}\ninclude {PLUGSTACK_D}/*.conf\n")
    elif f"{PLUGSTACK_D}/" not in PLUGSTACK.read_text(errors="replace"):
        return unavailable(f"{PLUGSTACK} does not include {PLUGSTACK_D}/*.conf (add that line)")
    PLUGSTACK_D.mkdir(parents=True, exist_ok=True)
    p["unavailable"].unlink(missing_ok=True)
    try:
        if CONF.read_text() == _conf(state, marker):
            return "ok"
    except OSError:
        pass
    tmp_conf = CONF.with_name(f".{CONF.name}.{os.getpid()}")
    tmp_conf.write_text(_conf(state, marker))
    os.chmod(tmp_conf, 0o644)
    os.replace(tmp_conf, CONF)
    log(f"pyxis test double: listed in {CONF}")
    return "new"


def describe(state: pathlib.Path) -> dict[str, str]:
    p = paths(state)
    try:
        why = p["unavailable"].read_text().split("\n", 1)[1].strip()
    except (OSError, IndexError):
        why = ""
    return {"unavailable": why, "plugin": str(p["so"]), "plugstack": str(CONF),
            "images_dir": str(p["images"]), "state_dir": str(p["state"]),
            "import_log": str(p["import_log"])}
