"""Hostile inputs through every renderer, run by a real shell (issue 16, items 1, 3, 11).

Hypothesis builds Slurm names, test ids, env names and values, mounts, paths and hosts
from the pieces attackers use (line breaks, CR, NUL, quotes, ``$()``, backticks, ``;``,
leading dashes, non-ASCII). Each value is either refused where it enters (a usage error
naming its source) or rendered; what is rendered is then RUN by bash (or sh, for what
sbatch --wrap and sshd run), with srun, sbatch, docker, podman and ssh replaced by a
recorder on PATH (a fake: it writes the argv and env it was given, nothing else). The
checks are what a user would check: the programs received exactly the intended argv and
env, and no injected command ran (the ``PWNED`` sentinel file never appears).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from devcluster import wait_for_job
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from pydantic import ValidationError

import pytest_trtllm_slurm.controller.options as options
import pytest_trtllm_slurm.planning.safe_values as safe_values
from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.execution.render.containers import WRAPPER_SCRIPT, wrap_in_container
from pytest_trtllm_slurm.execution.render.scripts import (
    SlurmOptions,
    render_rerun_sbatch,
    render_rerun_step,
    render_sbatch,
    render_step_command,
    render_step_launcher,
    rerun_argv,
    sbatch_directives,
    srun_in_job,
)
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.masking import hidden_env
from pytest_trtllm_slurm.planning.models import Scenario
from pytest_trtllm_slurm.planning.requirements import marker_config
from pytest_trtllm_slurm.planning.settings import ClusterConfig, load_clusters_file
from pytest_trtllm_slurm.transport.ssh.commands import remote_command
from pytest_trtllm_slurm.transport.ssh.openssh_shell import OpenSSHShell
from pytest_trtllm_slurm.transport.ssh.target import SSHTarget

SENTINEL = "PWNED"
#: what an attacker puts in a value: each one ends a line, a quote, a word or an option
PIECES = [
    "\n", "\r", "\r\n", "\x00", "\t", "\x1b[2J", "\u2028", "\u202e", "'", '"', "\\",
    f"$(touch {SENTINEL})", f"`touch {SENTINEL}`", f";touch {SENTINEL}", f"&& touch {SENTINEL}",
    f"|touch {SENTINEL}", f"\ntouch {SENTINEL} #", f"'; touch {SENTINEL}; '", "${HOME}", "$1",
    "-", "--", "-oProxyCommand=touch PWNED", "--wrap=touch PWNED", "#SBATCH --uid=0", "%j",
    "*", "?", "~", "{a,b}", " ", ",", ":", "=", "é", "名", "\U0001f600",
]
hostile = st.lists(st.one_of(st.sampled_from(PIECES), st.text(min_size=1, max_size=4)),
                   min_size=1, max_size=6).map("".join)
#: hostile text that stays on one line: what planning lets through into paths and job names
one_line = hostile.map(lambda t: "".join(c for c in t if not safe_values.control_chars(c)))
one_line = one_line.filter(bool)
#: anything an environment value or an argv element can hold (everything but NUL)
no_nul = hostile.map(lambda t: t.replace("\x00", ""))
#: names that pass the checks (hostile ones are the refusal tests' business)
slurm_names = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,10}", fullmatch=True)
valid_env_names = st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True)
env_names = st.one_of(valid_env_names, hostile)
FAST = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

RECORDER = r"""#!/bin/bash
# fake srun/sbatch/docker/podman/ssh for the hostile-input suite: records, runs nothing
n=$(basename "$0"); i=0
while [ -e "$REC_DIR/$n.$i.argv" ]; do i=$((i + 1)); done
env -0 > "$REC_DIR/$n.$i.env"
printf '%s\0' "$@" > "$REC_DIR/$n.$i.argv"
"""
FAKES = ("srun", "sbatch", "docker", "podman", "ssh", "scancel")


@pytest.fixture(scope="module")
def fake_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of recorders named like the programs the plugin runs (fakes, see RECORDER)."""
    folder = tmp_path_factory.mktemp("fakebin")
    for name in FAKES:
        path = folder / name
        path.write_text(RECORDER, encoding="utf-8")
        path.chmod(0o755)
    return folder


class Sandbox:
    """One example's folder: runs shell text or argv with the fakes first on PATH."""

    def __init__(self, fake_bin: Path) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="hostile-"))
        self.rec = self.dir / "rec"
        self.rec.mkdir()
        self.env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "REC_DIR": str(self.rec),
                    "HOME": str(self.dir), "LC_ALL": "C.UTF-8"}

    def run(self, argv: list[str],
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(argv, cwd=self.dir, env={**self.env, **(env or {})},
                              capture_output=True, timeout=30, check=False)

    def calls(self, program: str) -> list[int]:
        return sorted(int(p.name.split(".")[1]) for p in self.rec.glob(f"{program}.*.argv"))

    def argv(self, program: str, call: int = -1) -> list[str]:
        """The full argv (its name first) of ``program``'s last call (or call number ``call``)."""
        calls = self.calls(program)
        assert calls, f"{program} was never run; files: {os.listdir(self.rec)}"
        data = (self.rec / f"{program}.{calls[call]}.argv").read_bytes()
        return [program, *(p.decode("utf-8", "surrogateescape") for p in data.split(b"\0")[:-1])]

    def env_of(self, program: str, call: int = -1) -> dict[str, str]:
        data = (self.rec / f"{program}.{self.calls(program)[call]}.env").read_bytes()
        pairs = (p.decode("utf-8", "surrogateescape").partition("=")
                 for p in data.split(b"\0") if p)
        return {k: v for k, _, v in pairs}

    def assert_nothing_injected(self) -> None:
        found = [str(p) for p in self.dir.rglob("*") if p.name.startswith(SENTINEL)]
        assert found == [], f"an injected command ran: {found}"

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def sandbox(fake_bin: Path):
    boxes: list[Sandbox] = []

    def make() -> Sandbox:
        boxes.append(Sandbox(fake_bin))
        return boxes[-1]

    yield make
    for box in boxes:
        box.close()


def _event(text: str) -> None:
    """Count ``text`` in hypothesis' statistics (--hypothesis-show-statistics)."""
    if currently_in_test_context():
        event(text)


def spec_or_refusal(**fields: object) -> JobSpec | None:
    """The JobSpec, or None when the model refuses a value (asserting it says why)."""
    base: dict[str, object] = dict(
        scenario=Scenario.LOCAL_SLURM, name="b-0", job_name="acct_a.b-0",
        command=["python3", "-m", "pytest", "-q"], rerun_argv=["python3", "-m", "pytest", "-q"],
        rootdir="/repo", work_dir="/repo/work_dirs/b-0", log_path="/repo/work_dirs/b-0/job.log",
        reports_path="/repo/work_dirs/b-0/reports.jsonl", account="acct_a", partition="batch",
        total_devices=4, devices_per_node=4,
    )
    base.update(fields)
    try:
        spec = JobSpec(**base)
    except ValidationError as exc:
        assert exc.errors() and all(e["msg"] for e in exc.errors())
        _event(f"refused by JobSpec: {sorted({str(e['loc'][0]) for e in exc.errors()})}")
        return None
    _event("rendered and run")
    return spec


def _paths_in(box: Sandbox, name: str) -> tuple[str, str]:
    """A work folder and a log path under ``box`` whose names hold ``name`` (no '/')."""
    safe = name.replace("/", "_").replace("\x00", "_") or "_"
    work = box.dir / f"w {safe}"[:120]
    work.mkdir(parents=True, exist_ok=True)
    return str(work), str(work / "job.log")


@pytest.mark.parametrize("check, good, bad", [
    (safe_values.slurm_name_problem, ["acct_a", "gpu-h200", "p.q+1", "A1"],
     ["", "-p", "a b", "acct'a", "a,b", "a\nb", "é", "a;b", "$(x)"]),
    (safe_values.env_name_problem, ["A", "_X1", "lower", "__"],
     ["", "1A", "A=B", "A B", "A-B", "é", "_"]),
    (safe_values.mount_problem, ["/a", "/a:/b", "/a:/b:ro", "/a::ro", "/a:/b:ro+rprivate"],
     ["", "a:/b", "/a,/etc:/x", "/a:b", "/a:/b:r,o", "/a:/b:ro:x", "/a\n:/b", ":/b"]),
    (safe_values.host_problem, ["login.example", "10.0.0.1", "[::1]", "gpu_login-2"],
     ["", "-oProxyCommand=x", "a b", "a;b", "me@login", "a\nb", "$(x)"]),
    (safe_values.user_problem, ["alice", "a.b-c", "svc$", "a@corp"], ["", "-l", "a b", "a;b"]),
    (safe_values.argument_problem, ["nvcr.io/nv/img:1", "img with space"],
     ["", "--privileged", "-v/:/x", "img\n-x"]),
    (safe_values.argument_problem, ["acct.$(x) `y`;z 'q'", "a/b"], ["", "-x", "a\rb", "a\x00"]),
])
def test_safe_value_rules(check, good, bad) -> None:
    """The rules in words (docs/security-model.md): each good value passes, each bad one gets a reason."""
    assert [v for v in good if check(v)] == []
    assert [v for v in bad if not check(v)] == []


# --------------------------------------------------------------------------- sbatch script


@FAST
@given(job_name=one_line, account=slurm_names, partition=slurm_names, folder=one_line,
       env_name=env_names, env_value=no_nul, arg=no_nul)
def test_sbatch_script_runs_only_srun_with_the_intended_argv(
    sandbox, job_name, account, partition, folder, env_name, env_value, arg
) -> None:
    box = sandbox()
    work, log = _paths_in(box, folder)
    spec = spec_or_refusal(job_name=job_name, account=account, partition=partition,
                           work_dir=work, log_path=log, invocation_dir=work,
                           env={env_name: env_value}, command=["python3", "-m", "pytest", arg])
    if spec is None:
        return
    opts = SlurmOptions("gres", "h200")
    script = render_sbatch(spec, gres_style="gres", gres_type="h200")
    # sbatch reads #SBATCH lines with shell-like quoting: together they are the intended
    # options, and no other line of the script is a directive
    read = [word for line in script.splitlines() if line.startswith("#SBATCH ")
            for word in shlex.split(line[len("#SBATCH "):])]
    log_option = log.replace("%", "%%")
    assert read == [*sbatch_directives(spec, opts), "-o", log_option, "-e", log_option,
                    "--open-mode=append", f"--chdir={work}"]
    path = box.dir / "job.sbatch"
    path.write_text(script, encoding="utf-8")
    res = box.run(["bash", str(path)], env=spec.env)  # sbatch's environment: the job's
    assert res.returncode == 0, res.stderr
    box.assert_nothing_injected()
    assert box.argv("srun") == srun_in_job(spec, opts)
    assert box.env_of("srun")[env_name] == env_value


@FAST
@given(value=hostile, field=st.sampled_from(["account", "partition", "job_name", "log_path",
                                              "invocation_dir", "time_limit", "work_dir"]))
def test_directive_values_never_leave_their_line(value, field) -> None:
    spec = spec_or_refusal(**{field: value})
    if spec is None:
        # defense in depth: a spec that skipped validation still renders nothing unsafe
        spec = spec_or_refusal()
        assert spec is not None
        spec = spec.model_copy(update={field: value})
    try:
        script = render_sbatch(spec)
    except ValueError as exc:
        assert "cannot stay on its line" in str(exc) or "NUL" in str(exc)
        assert safe_values.control_chars(value)
        return
    assert "\r" not in script and "\x00" not in script
    baseline = render_sbatch(spec.model_copy(update={field: "/benign"}))
    assert len(script.splitlines()) == len(baseline.splitlines())


# --------------------------------------------------------------------------- steps


@FAST
@given(job_name=one_line, folder=one_line, env_value=no_nul, stepid=one_line)
def test_step_launcher_runs_only_the_step(sandbox, job_name, folder, env_value, stepid) -> None:
    box = sandbox()
    work, log = _paths_in(box, folder)
    spec = spec_or_refusal(job_name=job_name, work_dir=work, log_path=log,
                           env={"HOSTILE": env_value})
    if spec is None:
        return
    step_argv = render_step_command(spec, "1234", stepid_path=f"{work}/{stepid}")
    text = render_step_launcher(step_argv, log_path=log, pid_path=f"{work}/srun.pid",
                                exit_path=f"{work}/exit_code", cwd=work, env=spec.env)
    path = box.dir / "step.sh"
    path.write_text(text, encoding="utf-8")
    assert "HOSTILE=" not in text  # named, its value not written
    # as the step's starter runs it: the values it does not hold in its environment
    res = box.run(["bash", str(path)], env=hidden_env(spec.env))
    assert res.returncode == 0, res.stderr
    box.assert_nothing_injected()
    assert box.argv("srun") == step_argv
    assert box.env_of("srun")["HOSTILE"] == env_value
    assert Path(work, "exit_code").read_text() == "0\n"


@FAST
@given(arg=no_nul, mount_dir=hostile, env_name=env_names, image=hostile)
def test_container_wrapper_runs_only_the_engine(sandbox, arg, mount_dir, env_name, image) -> None:
    box = sandbox()
    mount = f"/data/{mount_dir}:/data"
    try:
        argv = wrap_in_container(["python3", "-m", "pytest", arg], "docker", image,
                                 mounts=[mount], env_names=[env_name], workdir="/repo")
    except ValueError as exc:
        assert str(exc)
        refused = (safe_values.mount_problem(mount) or safe_values.env_name_problem(env_name)
                   or safe_values.argument_problem(image))
        assert refused, f"refused without a reason: {exc}"
        return
    res = box.run(argv)
    assert res.returncode == 0, res.stderr
    box.assert_nothing_injected()
    got = box.argv("docker", 0)
    assert got[1] == "run" and got[-5:] == [image, "python3", "-m", "pytest", arg]
    assert got[got.index("-v") + 1] == mount and got[got.index("-e") + 1] == env_name
    # the same through the script file the executor writes
    script = box.dir / "wrap.sh"
    script.write_text(WRAPPER_SCRIPT, encoding="utf-8")
    res = box.run(wrap_in_container(["python3", arg], "podman", image, script=str(script)))
    assert res.returncode == 0 and box.argv("podman", 0)[-3:] == [image, "python3", arg]
    assert box.argv("podman")[1:3] == ["rm", "-f"]  # the container is removed afterwards


# --------------------------------------------------------------------------- re-run lines


@FAST
@given(nodeid=no_nul, folder=st.one_of(one_line, hostile))
def test_rerun_lines_run_only_the_test(sandbox, nodeid, folder) -> None:
    box = sandbox()
    work, _ = _paths_in(box, folder)
    spec = spec_or_refusal(invocation_dir=work)
    if spec is None:
        return
    opts = SlurmOptions("gres", "h200")
    line = render_rerun_sbatch(spec, nodeid, opts)
    assert "\r" not in line and "\x1b" not in line  # nothing hides text in a terminal
    res = box.run(["bash", "-c", line])
    assert res.returncode == 0, res.stderr
    got = box.argv("sbatch")
    assert got[:-2] == ["sbatch", *sbatch_directives(spec, opts), f"--chdir={work}"]
    assert got[-2] == "--wrap"
    res = box.run(["sh", "-c", got[-1]])  # what sbatch runs the --wrap text with
    assert res.returncode == 0, res.stderr
    # the node id as the re-run gives it (made absolute when pytest ran outside the rootdir)
    inner = spec.model_copy(update={"command": rerun_argv(spec, nodeid)})
    assert box.argv("srun") == srun_in_job(inner, opts)
    box.assert_nothing_injected()

    line = render_rerun_step(spec, nodeid, "55", opts)
    res = box.run(["bash", "-c", line])
    assert res.returncode == 0, res.stderr
    assert box.argv("srun")[-1] == rerun_argv(spec, nodeid)[-1] and box.argv("srun")[1] == "--jobid=55"
    box.assert_nothing_injected()


# --------------------------------------------------------------------------- SSH


@FAST
@given(args=st.lists(no_nul, min_size=1, max_size=3), env_value=no_nul, folder=one_line)
def test_ssh_remote_command_runs_only_the_argv(sandbox, args, env_value, folder) -> None:
    """What sshd hands to the login shell (``sh -c``): the argv arrives intact."""
    box = sandbox()
    work, _ = _paths_in(box, folder)
    command = remote_command(["srun", *args], env={"HOSTILE": env_value}, cwd=work)
    res = box.run(["sh", "-c", command])
    assert res.returncode == 0, res.stderr
    box.assert_nothing_injected()
    assert box.argv("srun") == ["srun", *args] and box.env_of("srun")["HOSTILE"] == env_value


def _target(host: str, user: str) -> SSHTarget:
    cluster = ClusterConfig(name="c", ssh_host=host, user=user, known_hosts="/dev/null")
    return SSHTarget.from_cluster(cluster, ssh_config_path=os.devnull)


def _as_ipv4(host: str) -> str | None:
    """How ssh reads a numeric host ('0' is 0.0.0.0, '10.1' is 10.0.0.1), as inet_aton does."""
    try:
        return socket.inet_ntoa(socket.inet_aton(host))
    except OSError:
        return None


@FAST
@given(host=st.one_of(st.sampled_from(["login.example", "10.0.0.1", "[::1]"]), hostile),
       user=st.one_of(st.just("alice"), hostile))
def test_ssh_hosts_and_users_are_never_options(sandbox, host, user) -> None:
    """A host or user ssh would read as an option is refused where it is configured;
    what passes reaches the real ssh as the host (``ssh -G`` prints how ssh parsed it)."""
    try:
        target = _target(host, user)
    except (ValidationError, ConfigError) as exc:
        assert "ssh_host" in str(exc) or "user" in str(exc)
        assert safe_values.host_problem(host) or safe_values.user_problem(user)
        return
    assert not host.startswith("-") and not user.startswith("-")
    box = sandbox()
    shell = OpenSSHShell(target, ssh_binary="ssh", check=False)
    argv = [*shell._base(None), "-G", "--", target.alias, "true"]
    argv[0] = shutil.which("ssh", path="/usr/bin:/bin") or "ssh"
    res = box.run(argv)
    assert res.returncode == 0, res.stderr
    config = dict(line.split(" ", 1) for line in res.stdout.decode().splitlines() if " " in line)
    assert config["hostname"] in (host.strip("[]").lower(), host.lower(), _as_ipv4(host))
    assert config["user"] == user and "proxycommand" not in config
    box.assert_nothing_injected()


def test_openssh_puts_the_host_after_double_dash(sandbox, fake_bin, monkeypatch) -> None:
    box = sandbox()
    monkeypatch.setenv("REC_DIR", str(box.rec))
    shell = OpenSSHShell(_target("login.example", "alice"), ssh_binary=str(fake_bin / "ssh"),
                         check=False)
    shell._ssh("echo $(touch PWNED)", stdin=b"")
    got = box.argv("ssh")
    assert got[-3:] == ["--", "login.example", "echo $(touch PWNED)"]
    assert got[got.index("-l") + 1] == "alice"
    box.assert_nothing_injected()


# --------------------------------------------------------------------------- refusals


class Mark(SimpleNamespace):
    """What requirements reads of a pytest Mark (a stand-in, no pytest item needed)."""


@FAST
@given(name=env_names, value=hostile, mount=hostile)
def test_marker_env_and_mounts_are_checked_at_planning(name, value, mount) -> None:
    nodeid = "tests/t.py::test_x[a b]"
    env_bad = safe_values.env_name_problem(name) or safe_values.env_value_problem(value)
    mount_text = f"/data/{mount}"
    mount_bad = safe_values.mount_problem(mount_text)
    try:
        cfg = marker_config(nodeid, Mark(args=(), kwargs={"env": {name: value},
                                                          "mounts": [mount_text]}))
    except ConfigError as exc:
        assert str(exc).startswith(f"{nodeid}: trtllm_slurm marker:")
        assert env_bad or mount_bad
        return
    assert not env_bad and not mount_bad
    assert "," not in cfg.mounts[0] and not safe_values.control_chars(cfg.mounts[0])


@FAST
@given(value=hostile, name=st.sampled_from(["slurm_account", "slurm_partition"]))
def test_option_values_are_checked_with_their_source(value, name) -> None:
    opt = options.BY_NAME[name]
    try:
        got = options.coerce(opt, value, "env")
    except ConfigError as exc:
        assert str(exc).startswith(f"env {opt.env} ")
        return
    assert safe_values.slurm_name_problem(got) is None


@FAST
@given(value=hostile, key=st.sampled_from(["account", "partition", "ssh_host", "user",
                                           "container_image", "python", "remote_cwd",
                                           "user_root_dir", "models_root", "known_hosts"]))
def test_clusters_file_values_are_checked_with_their_key(tmp_path_factory, value, key) -> None:
    assume("\x00" not in value)  # TOML cannot carry NUL at all
    folder = tmp_path_factory.mktemp("clusters")
    path = folder / "clusters.toml"
    escaped = "".join(c if c.isprintable() and c not in '"\\' else f"\\u{ord(c):04x}"
                      if ord(c) < 0x10000 else f"\\U{ord(c):08x}" for c in value)
    path.write_text(f'[clusters.c]\n{key} = "{escaped}"\n', encoding="utf-8")
    try:
        clusters = load_clusters_file(path, folder)
    except ConfigError as exc:
        assert f"clusters.c.{key}" in str(exc) and str(path) in str(exc)
        return
    assert getattr(clusters.get("c"), key) == value
    assert not safe_values.control_chars(value)


@FAST
@given(value=hostile, key=st.sampled_from(["account", "partition", "model_name",
                                           "container_image", "mounts", "custom_env"]))
def test_case_inputs_are_checked_with_their_source(value, key) -> None:
    """Cases (``trtllm-slurm run`` flags, case files) feed the same job scripts."""
    from pytest_trtllm_slurm.cases.model import CaseInput

    field: object = {"mounts": [f"/data/{value}"], "custom_env": {"X": value}}.get(key, value)
    try:
        case = CaseInput.build("case file cases.yaml, case 3", **{key: field})
    except ConfigError as exc:
        assert str(exc).startswith(f"case file cases.yaml, case 3: {key}: ")
        return
    got = getattr(case, key)
    if key == "custom_env":
        assert "\x00" not in got["X"]
    elif key == "mounts":
        assert safe_values.mounts_problem(got) is None
    else:
        assert not safe_values.control_chars(got)
        assert key == "model_name" or not got.startswith("-")


# --------------------------------------------------------------------------- end to end


def test_real_sbatch_reads_hostile_values_as_intended(devcluster, tmp_path) -> None:
    """The real sbatch of the dev cluster parses the #SBATCH lines (its own quoting rules,
    not bash's): the job gets exactly the name, log file, working directory, env and argv
    it was given, and nothing injected runs."""
    from pytest_trtllm_slurm.execution.slurm.jobs import SlurmJobs
    from pytest_trtllm_slurm.transport.shell import LocalShell

    work = tmp_path / "w d'$(touch PWNED);x `touch PWNED` é"
    work.mkdir()
    rec = work / "rec"
    value = "line1\nline2\r\n#SBATCH --uid=0\n$(touch PWNED) `touch PWNED` 'q' \"d\" é\t"
    args = ["arg $(touch PWNED)", "it's", "\n;touch PWNED", "-oProxyCommand=touch PWNED"]
    record = 'printf "%s\\0" "$@" > "$REC"; printf "%s" "$HOSTILE" > "$REC.env"; pwd > "$REC.pwd"'
    spec = JobSpec(
        scenario=Scenario.LOCAL_SLURM, name="hostile", job_name="trtllm.$(touch PWNED) `id`;x 'q'",
        command=["/bin/sh", "-c", record, "sh", *args], rootdir=str(work),
        invocation_dir=str(work), work_dir=str(work), log_path=str(work / "job%.log"),
        reports_path=str(work / "reports.jsonl"), account=devcluster["default_account"],
        partition="batch", env={"HOSTILE": value, "REC": str(rec)}, time_limit="00:02:00",
    )
    script = work / "job.sbatch"
    script.write_text(render_sbatch(spec), encoding="utf-8")
    jobs = SlurmJobs(LocalShell())
    job_id = jobs.sbatch(str(script), cwd=str(work), script=script.read_text(), env=spec.env)
    try:
        state, _ = wait_for_job(job_id, timeout=240)  # long only when the cluster is busy
    finally:
        jobs.scancel([job_id])  # never left in the shared queue (a no-op once it ended)
    assert state == "COMPLETED", (work / "job%.log").read_text(errors="replace")
    assert rec.read_bytes().split(b"\0")[:-1] == [a.encode() for a in args]
    assert Path(f"{rec}.env").read_bytes().decode() == value  # (read_text folds \r\n)
    assert Path(f"{rec}.pwd").read_text(encoding="utf-8").strip() == str(work)
    assert "[trtllm-slurm] job" in (work / "job%.log").read_text()
    # the controller's record (sacct can show a placeholder name for a moment)
    shown = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                           text=True, check=True).stdout
    assert f"JobName={spec.job_name} UserId=" in shown
    assert [p for p in tmp_path.rglob("*") if p.name.startswith(SENTINEL)] == []


SUITE = '''
import pytest

@pytest.mark.trtllm_slurm(MARKER)
def test_hostile(): pass
'''


def _pytest(folder: Path, *args: str, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), **(env or {})}
    full.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=folder, env=full, capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.mark.parametrize("marker, found", [
    ('env={"A=B": "x"}', "name 'A=B' is not an environment variable name"),
    ('env={"OK": "a\\x00b"}', "NUL"),
    ('mounts=["/a,/etc:/x"]', "contains ','"),
    ('mounts="/data\\n/etc:/x"', "line break"),
    ('account="acct\\ntouch PWNED #"', "account"),
    ('partition="-p evil"', "starts with '-'"),
    ('container_image="--privileged"', "starts with '-'"),
])
def test_bad_marker_values_are_usage_errors_naming_the_test(tmp_path, marker, found) -> None:
    (tmp_path / "test_hostile.py").write_text(SUITE.replace("MARKER", marker), encoding="utf-8")
    res = _pytest(tmp_path, "--trtllm-remote", "--trtllm-scenario", "local_direct",
                  "--trtllm-dispatch", "all")
    out = res.stdout + res.stderr
    assert res.returncode == 4, out
    assert "INTERNALERROR" not in out
    assert "test_hostile.py::test_hostile: trtllm_slurm marker:" in out and found in out
    assert not list(tmp_path.rglob(f"{SENTINEL}*"))


@pytest.mark.parametrize("where", ["env", "cli", "ini", "clusters file"])
def test_newline_in_account_is_a_usage_error_naming_its_source(tmp_path, where) -> None:
    """The issue's case: account = "acct\\ntouch PWNED #" from each place a value comes from."""
    (tmp_path / "test_ok.py").write_text("def test_ok(): pass\n", encoding="utf-8")
    bad = "acct\ntouch PWNED #"
    args = ["--trtllm-remote"]
    env: dict[str, str] = {}
    if where == "env":
        env["TRTLLM_SLURM_ACCOUNT"] = bad
        expected = "env TRTLLM_SLURM_ACCOUNT"
    elif where == "cli":
        args.append(f"--slurm-account={bad}")
        expected = "--slurm-account"
    elif where == "ini":  # an ini value cannot hold a newline: a NUL-free control char does
        (tmp_path / "pytest.ini").write_text("[pytest]\ntrtllm_slurm_account = acct\x1b[2J\n",
                                             encoding="utf-8")
        expected = "ini trtllm_slurm_account"
    else:
        (tmp_path / "trtllm-slurm.toml").write_text(
            '[clusters.dev]\naccount = "acct\\ntouch PWNED #"\n', encoding="utf-8")
        args.append("--slurm-cluster=dev")
        expected = "clusters.dev.account"
    res = _pytest(tmp_path, *args, env=env)
    out = res.stdout + res.stderr
    assert res.returncode == 4, out
    assert expected in out and "INTERNALERROR" not in out
    assert not list(tmp_path.rglob(f"{SENTINEL}*"))


def test_bad_marker_value_under_xdist_errors_that_test_only(tmp_path) -> None:
    """An xdist worker cannot end the run with a usage error (xdist would report a crashed
    worker): the test whose marker is bad errors with the message; the others run."""
    (tmp_path / "test_hostile.py").write_text(
        SUITE.replace("MARKER", 'env={"A=B": "x"}') + "\ndef test_fine(): pass\n",
        encoding="utf-8")
    res = _pytest(tmp_path, "-n", "2", "--trtllm-remote", "--trtllm-scenario", "local_direct",
                  "--trtllm-dispatch", "all", "-rA")
    out = res.stdout + res.stderr
    assert res.returncode == 1 and "INTERNALERROR" not in out, out
    assert "ERROR test_hostile.py::test_hostile - trtllm_slurm marker: env: name 'A=B'" in out
    assert "PASSED test_hostile.py::test_fine" in out


# --------------------------------------------------------------------------- option injection


@pytest.mark.parametrize("bad", ["--user=root", "-u", "123 --user=root", "", "123\n456"])
def test_scancel_takes_only_job_ids(sandbox, monkeypatch, bad) -> None:
    """An id read back from a damaged state or step file must not become an option of
    scancel (``--user=root`` cancels every job of root)."""
    from pytest_trtllm_slurm.errors import ExecutionError
    from pytest_trtllm_slurm.execution.slurm.jobs import SlurmJobs
    from pytest_trtllm_slurm.transport.shell import LocalShell

    box = sandbox()
    monkeypatch.setenv("PATH", box.env["PATH"])
    monkeypatch.setenv("REC_DIR", str(box.rec))
    jobs = SlurmJobs(LocalShell())
    if bad:
        with pytest.raises(ExecutionError, match="refusing Slurm job id"):
            jobs.scancel(["77", bad])
        assert box.calls("scancel") == []
    jobs.scancel(["77", "77.3", "78_2", "79.batch"])
    assert box.argv("scancel") == ["scancel", "77", "77.3", "78_2", "79.batch"]


@pytest.mark.parametrize("image", ["--privileged", "-v/:/host", "img\n--privileged", ""])
def test_container_images_are_never_options(image) -> None:
    """docker/podman read the image as a positional argument: one that starts with '-'
    would be one more option of ``run`` (or of ``image inspect``)."""
    from pytest_trtllm_slurm.execution.local.docker import ContainerExecutor
    from pytest_trtllm_slurm.execution.render.containers import engine_run_argv

    spec = spec_or_refusal(container_image=image or None)
    assert spec is None or not image
    base = spec_or_refusal()
    assert base is not None
    with pytest.raises(ValueError):
        engine_run_argv("docker", base, name="n", image=image)
    with pytest.raises(ValueError):
        wrap_in_container(["true"], "podman", image)
    if image:
        with pytest.raises(ConfigError, match="container image"):
            ContainerExecutor("docker", run_flags=[]).check_image(image)


@pytest.mark.parametrize("config, names", [
    ("Host c\n  HostName -oProxyCommand=touch_PWNED\n", "HostName of c in ssh config"),
    ("Host c\n  User -oProxyCommand=x\n", "the SSH user of [clusters.c]"),
    ("Host c\n  ProxyJump -J@jump\n", "ProxyJump"),
    ("Host c\n  ProxyJump jump\nHost jump\n  HostName -ojump\n", "ProxyJump host 'jump'"),
])
def test_ssh_config_values_that_are_options_are_refused(tmp_path, config, names) -> None:
    """ssh config is another source of hosts and users: one that ssh would read as an
    option is a usage error naming where it was found."""
    path = tmp_path / "ssh_config"
    path.write_text(config, encoding="utf-8")
    with pytest.raises(ConfigError, match=re.escape(names)):
        target = SSHTarget.from_cluster(ClusterConfig(name="c", ssh_host="c"),
                                        ssh_config_path=path)
        target.jump_hosts()


HOSTILE_SUITE = '''
import os
import pytest

VALUE = "line1\\nline2\\r\\n#SBATCH --uid=0\\n$(touch PWNED) `touch PWNED` 'q' \\u00e9\\t"


@pytest.mark.trtllm_slurm(devices=1, env={"HOSTILE": VALUE})
@pytest.mark.parametrize("x", ["it's $(touch PWNED) ;x `touch PWNED`"])
def test_env_arrives(x):
    assert os.environ["HOSTILE"] == VALUE
    assert x == "it's $(touch PWNED) ;x `touch PWNED`"
'''


def test_hostile_marker_env_and_test_id_through_a_real_one_shot_job(devcluster, tmp_path) -> None:
    """The whole plugin on the dev cluster: a marker env value with line breaks, CR and
    command substitutions, and a test id full of quotes, reach the test unchanged through a
    real sbatch script; nothing injected runs."""
    (tmp_path / "test_hostile_env.py").write_text(HOSTILE_SUITE, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA",
                             "--trtllm-remote", "--trtllm-one-shot"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=400)  # long only when the shared cluster is busy
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: the plugin cancels its job
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "PASSED test_hostile_env.py::test_env_arrives[" in out
    assert [str(p) for p in tmp_path.rglob("*") if p.name.startswith(SENTINEL)] == []
