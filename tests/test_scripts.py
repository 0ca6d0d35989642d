"""Golden-file tests of the Slurm script rendering (exact text; UPDATE_GOLDEN=1 rewrites)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from pytest_trtllm_slurm.execution.render.scripts import (
    ContainerOptions,
    SlurmOptions,
    StepShare,
    gpu_flag,
    options_for,
    render_rerun_sbatch,
    render_rerun_step,
    render_sbatch,
    render_step_command,
    render_step_launcher,
    rerun_argv,
    task_layout,
)
from pytest_trtllm_slurm.planning.jobspec import JobSpec, PartitionInfo, PmixInfo, SlurmEnv
from pytest_trtllm_slurm.planning.models import Launch, Scenario

GOLDEN = Path(__file__).parent / "golden"
WORK = "/work/repo/work_dirs/batch-4gpu-1n-0_20250101_000000_1"
WORKER = [
    "/usr/bin/python3", "-m", "pytest", "-p", "pytest_trtllm_slurm.node.worker",
    "--trtllm-worker-reports", f"{WORK}/reports.jsonl",
    "--trtllm-worker-nodeids", f"{WORK}/nodeids.json",
    "--rootdir", "/work/repo", "-o", f"cache_dir={WORK}/.pytest_cache",
    "--junitxml", f"{WORK}/junit.xml", "--continue-on-collection-errors", "--capture=tee-sys",
]


def make_spec(**kw: object) -> JobSpec:
    base: dict[str, object] = dict(
        scenario=Scenario.LOCAL_SLURM, name="batch-4gpu-1n-0", job_name="acct_a.batch-4gpu-1n-0",
        nodeids=["tests/test_x.py::test_a[1-2]"], nodeids_file=f"{WORK}/nodeids.json",
        command=WORKER, rootdir="/work/repo", invocation_dir="/work/repo", node_count=1,
        total_devices=4, devices_per_node=4, device_type="H200", account="acct_a",
        partition="batch", time_limit="01:00:00", work_dir=WORK, log_path=f"{WORK}/job.log",
        reports_path=f"{WORK}/reports.jsonl",
    )
    base.update(kw)
    return JobSpec.model_validate(base)


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"missing golden file {path} (run with UPDATE_GOLDEN=1)"
    assert text == path.read_text(encoding="utf-8")


def test_single_one_node_gres() -> None:
    text = render_sbatch(make_spec(), gres_style="gres", gres_type="h200")
    check_golden("single_1n_gres.sbatch", text)


def test_single_two_nodes_gpus_per_node_one_process_on_first_node() -> None:
    spec = make_spec(node_count=2, total_devices=8, devices_per_node=4, name="b-8gpu-2n",
                     job_name="acct_a.b-8gpu-2n", env={"NCCL_DEBUG": "INFO", "X": "a b'c"})
    text = render_sbatch(spec, gres_style="gpus-per-node")
    check_golden("single_2n_gpus_per_node.sbatch", text)
    srun = text.strip().splitlines()[-1]
    assert shlex.split(srun)[:6] == ["srun", "--kill-on-bad-exit=1", "-N", "1", "--ntasks=1",
                                     "--ntasks-per-node=1"]


def test_mpi_eight_ranks_two_nodes_with_launcher_prefix() -> None:
    spec = make_spec(node_count=2, total_devices=8, devices_per_node=4, launch=Launch.MPI,
                     partition="gb200", mem_mb=2000)
    text = render_sbatch(spec, gres_style="gres", gres_type="gb200", mpi="pmix",
                         launcher_prefix=["trtllm-llmapi-launch"])
    check_golden("mpi_2n_8ranks.sbatch", text)
    assert task_layout(spec) == (8, 4)


#: values a JobSpec accepts that still hold every shell and sbatch metacharacter: line
#: breaks and control characters live in env values (rendered with $'...' escapes)
HOSTILE_ENV = {
    "A_B": "$HOME `id`",
    "MULTI": "line1\nline2\r\n#SBATCH --uid=0\ntouch PWNED #",
    "QUOTES": "it's \"q\" \\ $(touch PWNED); `touch PWNED` \t\x1b[2J \u2028 é",
}


def test_hostile_values_are_quoted() -> None:
    spec = make_spec(job_name="acct_a.$(rm -rf ~) `id`; x", account="acct_a", partition="p.q-1",
                     log_path=f"{WORK}/odd dir'$(touch PWNED)/%j.log",
                     invocation_dir="/work/re po;touch PWNED", total_devices=0,
                     devices_per_node=0, time_limit=None, env=HOSTILE_ENV)
    text = render_sbatch(spec)
    check_golden("hostile_values.sbatch", text)
    lines = text.splitlines()
    assert "\r" not in text and "\x00" not in text and "\u2028" not in text
    # every directive stays on its line and nothing but the shebang, directives, two
    # comments (the second names the variables: their values are not in the script), the
    # echo and srun is a line of the script
    starts = ("#!/bin/bash", "#SBATCH ", "# pytest-trtllm-slurm ", "echo ", "srun ")
    assert [line for line in lines if not line.startswith(starts)] == []
    assert len(lines) == 1 + 10 + 2 + 2 and lines[-1].startswith("srun ")
    assert all(value not in text for value in HOSTILE_ENV.values() if len(value) > 3)


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\x00b", "a\u2028b"])
@pytest.mark.parametrize("field", ["account", "partition", "job_name", "log_path",
                                   "invocation_dir", "time_limit"])
def test_directive_values_with_line_breaks_are_refused(field: str, bad: str) -> None:
    """The model refuses them (planning names the source); the renderer refuses them again
    when a spec bypassed validation (defense in depth): never rendered, never escaped."""
    with pytest.raises(ValueError):
        make_spec(**{field: bad})
    spec = make_spec().model_copy(update={field: bad})
    with pytest.raises(ValueError, match="cannot stay on its line|NUL"):
        render_sbatch(spec)


@pytest.mark.parametrize("env", [{"BAD NAME": "x"}, {"A=B": "x"}, {"1A": "x"}, {"A": "x\x00y"}])
def test_bad_env_is_refused(env: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        make_spec(env=env)
    with pytest.raises(ValueError):
        render_sbatch(make_spec().model_copy(update={"env": env}))


def test_container_flags() -> None:
    spec = make_spec(container_image="nvcr.io#nvidia/pytorch:25.01", mounts=["/data:/data"])
    cont = ContainerOptions(image="nvcr.io#nvidia/pytorch:25.01", name="acct_a-trtllm",
                            mounts=("/data:/data", "/work/repo:/work/repo"), workdir="/work/repo")
    check_golden("container.sbatch", render_sbatch(spec, gres_style="gres", gres_type="h200",
                                                   container=cont))


def test_step_command_always_has_nodes_exact_and_gpus() -> None:
    spec = make_spec(total_devices=1, devices_per_node=1)
    argv = render_step_command(spec, "1234", gres_style="gres", gres_type="h200",
                               share=StepShare(cpus_per_task=2, mem_mb=1000),
                               stepid_path=f"{WORK}/stepid")
    check_golden("step_1gpu.argv", shlex.join(argv) + "\n")
    assert argv[:4] == ["srun", "--jobid=1234", "-N", "1"]
    assert "--exact" in argv and "--gres=gpu:h200:1" in argv and "--kill-on-bad-exit=1" in argv
    assert "--job-name=acct_a.batch-4gpu-1n-0" in argv
    # node ids never on a command line
    assert not any("test_a" in a for a in argv)


def test_step_command_mpi_two_nodes() -> None:
    spec = make_spec(node_count=2, total_devices=8, devices_per_node=4, launch=Launch.MPI)
    argv = render_step_command(spec, "77", gres_style="gpus-per-node", mpi="pmi2",
                               launcher_prefix=["trtllm-llmapi-launch"],
                               share=StepShare(overlap=True))
    check_golden("step_mpi_2n.argv", shlex.join(argv) + "\n")
    assert argv[2:4] == ["-N", "2"] and "--overlap" in argv and "--mpi=pmi2" in argv


def test_step_launcher() -> None:
    spec = make_spec(total_devices=1, devices_per_node=1, env={"K": "v w"})
    argv = render_step_command(spec, "1234", stepid_path=f"{WORK}/stepid")
    text = render_step_launcher(argv, log_path=f"{WORK}/job.log", pid_path=f"{WORK}/srun.pid",
                                exit_path=f"{WORK}/exit_code", cwd="/work/repo", env=spec.env)
    check_golden("step_launcher.sh", text)
    assert text.splitlines()[2].startswith("exec >>")


def test_gpu_flag_and_options_from_discovery() -> None:
    assert gpu_flag(0, "gres") is None
    assert gpu_flag(2, "gres") == "--gres=gpu:2"
    assert gpu_flag(2, "gres", "h200") == "--gres=gpu:h200:2"
    assert gpu_flag(2, "gpus-per-node", "h200") == "--gpus-per-node=2"
    env = SlurmEnv(partitions=[
        PartitionInfo(name="batch", gpu_type="h200", gpus_per_node=4, requires_gres=True,
                      default=True),
        PartitionInfo(name="cpu"),
    ], pmix=PmixInfo(available=["pmi2", "pmix"], preferred="pmix"))
    opts = options_for(make_spec(slurm_env=env))
    assert opts == SlurmOptions("gres", "h200", "pmix")
    assert options_for(make_spec(slurm_env=env, partition="cpu")).gres_style == "gpus-per-node"
    assert options_for(make_spec(partition=None, slurm_env=env)).gres_type == "h200"


def test_rerun_commands_quote_the_nodeid() -> None:
    base = ["/usr/bin/python3", "-m", "pytest", "--rootdir", "/work/repo", "--tb=short"]
    spec = make_spec(rerun_argv=base)
    nodeid = "tests/test_x.py::test_a[it's $HOME]"
    assert rerun_argv(spec, nodeid) == [*base, nodeid]
    assert rerun_argv(make_spec(), nodeid) == WORKER  # not a pytest batch: its own command
    opts = SlurmOptions("gres", "h200")
    line = render_rerun_sbatch(spec, nodeid, opts)
    check_golden("rerun_sbatch.txt", line + "\n")
    argv = shlex.split(line)
    assert argv[0] == "sbatch" and "--gres=gpu:h200:4" in argv
    wrapped = shlex.split(argv[argv.index("--wrap") + 1])
    assert wrapped[-1] == nodeid
    step = render_rerun_step(spec, nodeid, "55", opts)
    check_golden("rerun_step.txt", step + "\n")
    assert shlex.split(step.split(" && ", 1)[1])[-1] == nodeid


def test_a_batch_masks_its_rerun_options_once_and_a_changed_copy_anew(monkeypatch) -> None:
    """Every replayed test's re-run line starts with the batch's masked options: masked once
    per batch (it was once per test, 7% of a 2,000-test run's loop), never stale."""
    import pytest_trtllm_slurm.planning.jobspec as jobspec

    calls: list[tuple[str, ...]] = []
    real = jobspec.mask_argv

    def counted(argv):
        calls.append(tuple(argv))
        return real(argv)

    monkeypatch.setattr(jobspec, "mask_argv", counted)
    spec = make_spec(rerun_argv=["python3", "-m", "pytest", "--api-token=tok-1", "-x"])
    opts = SlurmOptions("gres", "h200")
    lines = [render_rerun_step(spec, f"t.py::test_{i}", "55", opts) for i in range(5)]
    assert len(calls) == 1
    assert all("tok-1" not in line and "--api-token=***" in line for line in lines)
    other = spec.model_copy(update={"rerun_argv": ["python3", "-m", "pytest", "--password",
                                                   "hunter2", "-q"]})
    argv = rerun_argv(other, "t.py::test_x")
    assert argv == ["python3", "-m", "pytest", "--password", "***", "-q", "t.py::test_x"]
    spec.rerun_argv.append("--hf_token=tok-3")  # changed in place: masked again, not stale
    assert rerun_argv(spec, "t.py::test_y")[-2:] == ["--hf_token=***", "t.py::test_y"]
    assert len(calls) == 3
