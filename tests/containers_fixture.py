"""Container engines and a local test image for the suite (no registry is reachable).

Session fixtures (registered by one import line in tests/conftest.py):

- ``trtllm_image``: builds (once, cached by content) a small rootfs that holds busybox, a copy
  of THIS interpreter (same absolute paths, its shared libraries found with ``ldd``, the
  standard library without tests/idle/tkinter) and pytest with its dependencies copied from
  this interpreter's site-packages. The plugin itself is NOT in the image: executors mount
  it (as they must for a real TensorRT-LLM image). ``/etc/trtllm-test-image`` exists only
  inside the image, so a test can prove where it ran. ``/usr/bin/python3`` is the image's
  python. Also packed as ``image.tar`` for ``docker import`` / ``podman import``.
- ``docker_engine`` / ``podman_engine``: a running engine with the image imported, each
  with its OWN state (dockerd: own socket, data root, exec root, started detached and left
  running, like the dev cluster; podman: own --root/--runroot, runc, cgroupfs). Nothing in
  /etc is touched and a docker daemon the machine may have is left alone.

Engines and the image are shared across xdist workers (file locks) and across sessions
(content-addressed tag; an engine that answers is reused). ``python tests/containers_fixture.py
build|up|down|clean`` does the same by hand (``down`` stops our dockerd; ``clean`` also
removes every store, image and container of ours).

Measured on a 2-CPU Debian 12 VM (packages installed), from nothing: rootfs 1.7 s (93 MB:
busybox, python 3.11 + stdlib 50 MB + libpython 23 MB, pytest & deps 7 MB), tar 0.15 s,
dockerd start 0.5 s, docker import 1.7 s, podman import 2.8 s: 7.7 s in all. Cached: 0.1 s.
The resource defaults of the executor do not all work on such a machine (no CAP_SYS_RESOURCE:
``--ulimit memlock=-1`` fails); see pytest_trtllm_slurm/execution/local/docker.py.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata as md
import inspect
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from filelock import FileLock

STATE = Path(os.environ.get("TRTLLM_CONTAINERS_DIR") or "/var/tmp/trtllm-containers")
IMAGE_REPO = "localhost/trtllm-test"
MARKER_PATH = "/etc/trtllm-test-image"
IMAGE_PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BUILDER_VERSION = "3"  # bump when the rootfs layout changes

# parts of the standard library a test run never needs (big or GUI)
_STDLIB_SKIP = {"site-packages", "dist-packages", "test", "idlelib", "tkinter", "turtledemo",
                "ensurepip", "lib2to3", "__phello__"}
_TOP_DISTS = ["pytest"]


@dataclasses.dataclass(frozen=True)
class LocalImage:
    name: str  # localhost/trtllm-test:<tag>, the same in docker and podman
    tag: str
    rootfs: Path
    tar: Path
    marker_path: str
    marker_text: str
    python: str  # the image's python, an absolute path inside it
    build_seconds: float = 0.0


@dataclasses.dataclass(frozen=True)
class Engine:
    name: str  # "docker" | "podman"
    cli: tuple[str, ...]  # argv prefix that reaches OUR daemon / store
    env: dict = dataclasses.field(default_factory=dict)

    def run(self, *args, check=True, timeout=120):
        r = subprocess.run([*self.cli, *args], capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL, env={**os.environ, **self.env})
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(self.cli)} {' '.join(args)} failed ({r.returncode}):\n"
                               f"{r.stdout}{r.stderr}")
        return r

    def containers(self, label: str | None = None) -> list[str]:
        """Names of all containers (running or not) of this engine, optionally by label."""
        args = ["ps", "-a", "--format", "{{.Names}}"]
        if label:
            args[2:2] = ["--filter", f"label={label}"]
        return [n for n in self.run(*args).stdout.split() if n]


# --------------------------------------------------------------------------- the rootfs

def _log(msg: str) -> None:
    print(f"[containers] {msg}", file=sys.stderr, flush=True)


def _dists() -> list[md.Distribution]:
    """pytest and what it requires on this interpreter (markers evaluated), deduplicated."""
    from packaging.requirements import Requirement

    seen: dict[str, md.Distribution] = {}
    todo = list(_TOP_DISTS)
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        dist = md.distribution(name)
        seen[key] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return sorted(seen.values(), key=lambda d: d.metadata["Name"].lower())


def image_tag() -> str:
    """Content address of the image: this builder, the interpreter, the copied dists."""
    h = hashlib.sha256()
    h.update(BUILDER_VERSION.encode())
    h.update(inspect.getsource(build_rootfs).encode())
    h.update(sys.version.encode() + os.path.realpath(sys.executable).encode())
    for dist in _dists():
        h.update(f"{dist.metadata['Name']}=={dist.version}@{dist.locate_file('')}".encode())
    return h.hexdigest()[:12]


def _copy_file(src: Path, root: Path, dest: str | None = None) -> None:
    """Copy ``src`` (symlinks followed) to the same absolute path (or ``dest``) under root."""
    target = root / (dest or str(src)).lstrip("/")
    if target.exists() or target.is_symlink():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(os.path.realpath(src), target)


def _copy_tree(src: Path, root: Path, skip_top: set[str]) -> None:
    want = f".{sys.implementation.cache_tag}.pyc"
    for dirpath, dirnames, filenames in os.walk(src):
        here = Path(dirpath)
        if here == src:
            dirnames[:] = [d for d in dirnames if d not in skip_top and not d.startswith("config-")]
        for fn in filenames:
            if here.name == "__pycache__" and not fn.endswith(want):
                continue  # only this interpreter's plain .pyc (no opt-1/opt-2)
            _copy_file(here / fn, root)


def _ldd(paths: list[Path]) -> set[str]:
    libs: set[str] = set()
    for chunk in range(0, len(paths), 200):
        r = subprocess.run(["ldd", *map(str, paths[chunk:chunk + 200])], capture_output=True,
                           text=True, check=False)
        for line in r.stdout.splitlines():
            m = re.search(r"=>\s+(/\S+)", line) or re.match(r"\s*(/\S+)\s+\(0x", line)
            if m:
                libs.add(m.group(1))
    return libs


def build_rootfs(root: Path, tag: str) -> None:
    for d in ("usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "etc", "root", "dev", "proc", "sys",
              "run", "var/tmp", "tmp"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for link in ("bin", "sbin", "lib", "lib64"):  # merged /usr, whatever the host has
        (root / link).symlink_to(f"usr/{link}")
    os.chmod(root / "tmp", 0o1777)
    os.chmod(root / "var/tmp", 0o1777)

    ensure_packages()
    busybox = Path("/bin/busybox")
    _copy_file(busybox, root, "/usr/bin/busybox")
    listing = subprocess.run([str(busybox), "--list-full"], capture_output=True, text=True,
                             check=True).stdout.split()
    for applet in listing:
        target = root / applet
        if not (target.exists() or target.is_symlink()):
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to("/usr/bin/busybox")

    exe = Path(os.path.realpath(sys.executable))
    _copy_file(exe, root)
    for name in ("python3", "python"):
        link = root / "usr/bin" / name
        if link.exists() or link.is_symlink():
            link.unlink()
        link.symlink_to(str(exe))
    stdlib = {Path(sysconfig.get_path("stdlib")), Path(sysconfig.get_path("platstdlib"))}
    for d in stdlib:
        _copy_tree(d, root, _STDLIB_SKIP)
    site_dirs = set()
    for dist in _dists():
        for f in dist.files or []:
            src = Path(dist.locate_file(f))
            if src.is_file() and "__pycache__" not in src.parts:
                _copy_file(src, root)
        site_dirs.add(str(Path(dist.locate_file("")).resolve()))
    # the dists' directories may not be the image interpreter's own site dir (a venv, Debian's
    # dist-packages): list them in a .pth of its purelib
    purelib = sysconfig.get_path("purelib", vars={"base": sys.base_prefix,
                                                  "platbase": sys.base_exec_prefix})
    pth = root / purelib.lstrip("/") / "trtllm-test-image.pth"
    pth.parent.mkdir(parents=True, exist_ok=True)
    pth.write_text("".join(f"{d}\n" for d in sorted(site_dirs)))

    elf = [exe] + [p for p in root.rglob("*.so*") if p.is_file() and not p.is_symlink()]
    host_paths = [Path("/" + str(p.relative_to(root))) if p != exe else exe for p in elf]
    for lib in sorted(_ldd([p for p in host_paths if p.exists()])):
        _copy_file(Path(lib), root)

    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n"
                                     "nobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\nnogroup:x:65534:\n")
    (root / "etc/environment").write_text(f"PATH={IMAGE_PATH_ENV}\nTRTLLM_TEST_IMAGE={tag}\n")
    (root / MARKER_PATH.lstrip("/")).write_text(f"trtllm-test-image {tag}\n")


STALE_IMAGE_SECONDS = 12 * 3600


def _built_at(image_dir: Path) -> float:
    """When a tag's build completed (0 when it never did)."""
    try:
        return (image_dir / "complete").stat().st_mtime
    except OSError:
        return 0.0


def ensure_image() -> LocalImage:
    """The rootfs and its tar, built once per content tag (file-locked)."""
    tag = image_tag()
    base = STATE / "images"
    base.mkdir(parents=True, exist_ok=True)
    out = base / tag
    image = LocalImage(name=f"{IMAGE_REPO}:{tag}", tag=tag, rootfs=out / "rootfs",
                      tar=out / "image.tar", marker_path=MARKER_PATH,
                      marker_text=f"trtllm-test-image {tag}", python="/usr/bin/python3")
    with FileLock(str(base / ".build.lock")):
        if (out / "complete").exists():
            return image
        t0 = time.monotonic()
        shutil.rmtree(out, ignore_errors=True)
        tmp = base / f".{tag}.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "rootfs").mkdir(parents=True)
        build_rootfs(tmp / "rootfs", tag)
        t1 = time.monotonic()
        subprocess.run(["tar", "-C", str(tmp / "rootfs"), "--numeric-owner", "-cf",
                        str(tmp / "image.tar"), "."], check=True)
        elapsed = time.monotonic() - t0
        (tmp / "complete").write_text(json.dumps({"rootfs_s": round(t1 - t0, 2),
                                                  "total_s": round(elapsed, 2)}) + "\n")
        os.replace(tmp, out)
        for old in base.iterdir():  # earlier tags (the pyxis double links their rootfs):
            # only stale ones, so a run from another venv (another tag) keeps its image
            if (old.is_dir() and old.name != tag and not old.name.startswith(".")
                    and time.time() - _built_at(old) > STALE_IMAGE_SECONDS):
                shutil.rmtree(old, ignore_errors=True)
        _log(f"built {image.name}: rootfs {t1 - t0:.2f} s, with tar {elapsed:.2f} s")
        return dataclasses.replace(image, build_seconds=elapsed)


# --------------------------------------------------------------------------- engines

@functools.cache
def ensure_packages() -> None:
    """The engines and busybox, installed by the suite itself when missing (root + apt-get):
    README's test command must work on a fresh machine, not only after .ci/run."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "trtllm_tests_debian", Path(__file__).resolve().parent / "cluster" / "debian.py")
    debian = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(debian)
    try:
        debian.ensure("containers")
    except debian.PackagesMissing as e:
        raise RuntimeError(str(e)) from None


def _which(name: str) -> str:
    ensure_packages()
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} not found after installing the container packages "
                           "(tests/cluster/debian.py, group 'containers')")
    return path


def docker_paths() -> dict[str, Path]:
    d = STATE / "docker"
    return {"dir": d, "sock": d / "docker.sock", "pid": d / "dockerd.pid", "data": d / "data",
            "exec": d / "exec", "log": d / "dockerd.log"}


def _alive(pidfile: Path, comm: str) -> int | None:
    try:
        pid = int(pidfile.read_text().split()[0])
        if Path(f"/proc/{pid}/comm").read_text().strip() == comm:
            return pid
    except (OSError, ValueError, IndexError):
        pass
    return None


def ensure_docker(timeout: float = 60) -> Engine:
    """Our own dockerd (own socket and data root), started detached if it does not answer."""
    p = docker_paths()
    p["dir"].mkdir(parents=True, exist_ok=True)
    engine = Engine("docker", (_which("docker"), "-H", f"unix://{p['sock']}"))
    with FileLock(str(p["dir"] / ".start.lock")):
        if engine.run("info", "--format", "{{.ServerVersion}}", check=False,
                      timeout=30).returncode == 0:
            return engine
        old = _alive(p["pid"], "dockerd")
        if old:  # ours but not answering: restart it
            os.kill(old, signal.SIGTERM)
            time.sleep(1)
        dockerd = _which("dockerd")
        t0 = time.monotonic()
        with open(p["log"], "ab") as log:
            subprocess.Popen(
                [dockerd, "--data-root", str(p["data"]), "--exec-root", str(p["exec"]),
                 "-H", f"unix://{p['sock']}", "--pidfile", str(p["pid"]),
                 "--iptables=false", "--ip-masq=false", "--bridge=none",
                 "--exec-opt", "native.cgroupdriver=cgroupfs"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                close_fds=True, cwd="/")
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if engine.run("info", "--format", "{{.ServerVersion}}", check=False,
                          timeout=30).returncode == 0:
                _log(f"dockerd up in {time.monotonic() - t0:.2f} s ({p['sock']})")
                return engine
            time.sleep(0.1)
        tail = p["log"].read_text(errors="replace").splitlines()[-30:]
        raise RuntimeError(f"dockerd did not answer within {timeout}s:\n" + "\n".join(tail))


def stop_docker() -> None:
    p = docker_paths()
    pid = _alive(p["pid"], "dockerd")
    if pid:
        os.kill(pid, signal.SIGTERM)
        for _ in range(150):
            if not _alive(p["pid"], "dockerd"):
                break
            time.sleep(0.1)
    netns = p["exec"] / "netns" / "default"  # dockerd leaves this nsfs mount behind
    if os.path.ismount(netns):
        subprocess.run(["umount", str(netns)], check=False)


def _podman_driver() -> str:
    return "overlay" if "\toverlay\n" in Path("/proc/filesystems").read_text() else "vfs"


def ensure_podman() -> Engine:
    """Rootful podman with its own store; runc + cgroupfs (crun rejects hybrid cgroups here).

    The storage driver is named from the store's first use on: podman's database keeps it,
    and a storage.conf names it (tests/test_docker_dispatch.py::_engine_env), which puts
    ``--storage-driver`` into the clean-up command of every container. A store made without
    the flag keeps "" and refuses that command ("database configuration mismatch"): each
    ``podman run --rm`` then waited 20 s for a clean-up that never ran (measured: 20.4 s
    against 0.9 s)."""
    driver = _podman_driver()
    d = STATE / f"podman-{driver}"  # (the store made without the flag was STATE/podman)
    d.mkdir(parents=True, exist_ok=True)
    conf = d / "containers.conf"
    # ulimits podman would otherwise raise (needs CAP_SYS_RESOURCE); see infra facts item 6
    conf.write_text('[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]\n'
                    '[engine]\nevents_logger = "file"\ncgroup_manager = "cgroupfs"\n')
    cli = [_which("podman"), "--root", str(d / "root"), "--runroot", str(d / "run"),
           "--storage-driver", driver, "--cgroup-manager", "cgroupfs", "--events-backend", "file"]
    if shutil.which("runc"):
        cli += ["--runtime", "runc"]
    engine = Engine("podman", tuple(cli), {"CONTAINERS_CONF": str(conf)})
    engine.run("info", "--format", "{{.Host.OCIRuntime.Name}}", timeout=60)
    return engine


def ensure_imported(engine: Engine, image: LocalImage) -> None:
    with FileLock(str(STATE / f".import-{engine.name}.lock")):
        if engine.run("image", "inspect", image.name, check=False).returncode == 0:
            return
        t0 = time.monotonic()
        engine.run("import", "--change", f"ENV PATH={IMAGE_PATH_ENV}", "--change",
                   'CMD ["/bin/sh"]', str(image.tar), image.name, timeout=300)
        _log(f"{engine.name} import {image.name}: {time.monotonic() - t0:.2f} s")


# --------------------------------------------------------------------------- fixtures

def _skip_or_fail(what: str, exc: Exception):
    # CI installs the engines (.ci/run): there a missing engine is a failure, never a skip
    pytest.fail(f"{what} is not usable here: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def trtllm_image() -> LocalImage:
    try:
        return ensure_image()
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        _skip_or_fail("the container test image", exc)
        raise


@pytest.fixture(scope="session")
def docker_engine(trtllm_image: LocalImage) -> Engine:
    try:
        engine = ensure_docker()
        ensure_imported(engine, trtllm_image)
        return engine
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        _skip_or_fail("docker", exc)
        raise


@pytest.fixture(scope="session")
def podman_engine(trtllm_image: LocalImage) -> Engine:
    try:
        engine = ensure_podman()
        ensure_imported(engine, trtllm_image)
        return engine
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        _skip_or_fail("podman", exc)
        raise


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else "up"
    if cmd == "build":
        t0 = time.monotonic()
        image = ensure_image()
        print(json.dumps({"image": image.name, "rootfs": str(image.rootfs),
                          "seconds": round(time.monotonic() - t0, 2)}))
    elif cmd == "up":
        image = ensure_image()
        for engine in (ensure_docker(), ensure_podman()):
            ensure_imported(engine, image)
            print(json.dumps({"engine": engine.name, "cli": engine.cli, "env": engine.env,
                              "image": image.name}))
    elif cmd == "down":
        stop_docker()
    elif cmd == "clean":  # down, then remove every image, container and store of ours
        stop_docker()
        for mnt in sorted((line.split()[1] for line in Path("/proc/mounts").read_text()
                           .splitlines() if line.split()[1].startswith(str(STATE) + "/")),
                          key=len, reverse=True):
            subprocess.run(["umount", mnt], check=False)
        shutil.rmtree(STATE, ignore_errors=True)
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
