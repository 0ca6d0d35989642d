"""Persistent allocation + pyxis container setup (seed exec-local-slurm Step 0E/0F) through
AllocationManager, against the REAL dev cluster whose srun loads the pyxis test double
(tests/cluster/spank): import on every node, mount warm-up, install once with
--container-writable, nothing imported by a later run, a changed image set up in the SAME
allocation. Asserted on the double's import log and on job ids, never on time.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from devcluster import run
from test_pyxis_double import imports, pyxis  # noqa: F401  (module fixture)

from pytest_trtllm_slurm.errors import ExecutionError
from pytest_trtllm_slurm.execution.render.containers import container_name_for
from pytest_trtllm_slurm.execution.slurm.alloc_containers import setup_mounts
from pytest_trtllm_slurm.execution.slurm.allocation import (
    AllocationManager,
    AllocationRequest,
    AllocationState,
)
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.models import Scenario
from pytest_trtllm_slurm.planning.resolve import enroot_uri
from pytest_trtllm_slurm.transport.shell import CommandResult, LocalShell

pytestmark = pytest.mark.devcluster

ACCOUNT = "acct_a"
# written into the container's rootfs: only possible with --container-writable (the double
# mounts the rootfs read-only otherwise), and seen by later read-only steps of that container
INSTALL = 'mkdir -p /opt && echo "installed in $(pwd)" > /opt/installed-by-setup'


class RecordingShell(LocalShell):
    """LocalShell that keeps every argv it ran (to see which srun steps a run issued)."""

    def __init__(self) -> None:
        self.argvs: list[list[str]] = []

    def run(self, argv: list[str], **kw: Any) -> CommandResult:
        self.argvs.append(list(argv))
        return super().run(argv, **kw)

    def setup_steps(self) -> list[list[str]]:
        return [a for a in self.argvs if a[0] == "srun" and any(
            x.startswith("--container-name=") for x in a)]


def request(root: Path, image: str, *, nodes: int = 2, install: str | None = INSTALL
            ) -> AllocationRequest:
    """Non-exclusive, CPU-only, on batch (n1, n2): other tests' jobs can share the nodes."""
    return AllocationRequest(
        partition="batch", account=ACCOUNT, nodes=nodes, gpus_per_node=0, exclusive=False,
        time_limit="10", docker_image=image, container_runtime="pyxis",
        install_command=install, install_workdir=str(root),
        container_mounts=setup_mounts(str(root)))


def manager(root: Path, req: AllocationRequest) -> tuple[AllocationManager, RecordingShell]:
    shell = RecordingShell()
    return AllocationManager(shell, rootdir=root, request=req, wait_seconds=240), shell


def per_node(lines: list[str]) -> Counter[str]:
    return Counter(re.search(r" node=(\S+)", line).group(1) for line in lines)  # type: ignore[union-attr]


def hostnames(job_id: str) -> set[str]:
    nodelist = run(["squeue", "-h", "-j", job_id, "-o", "%N"]).stdout.strip()
    return set(run(["scontrol", "show", "hostnames", nodelist]).stdout.split())


def read_installed(job_id: str, image: str, name: str) -> list[str]:
    """``cat`` of the installed file in a read-only step of container ``name`` on each node
    (the flags a job step uses: --container-image and the same --container-name)."""
    r = run(["srun", f"--jobid={job_id}", "-N2", "--ntasks-per-node=1", "--overlap",
             f"--container-image={image}", f"--container-name={name}",
             "cat", "/opt/installed-by-setup"], timeout=120)
    return sorted(r.stdout.splitlines())


def spec(image: str) -> JobSpec:
    return JobSpec(scenario=Scenario.LOCAL_SLURM, name="b", job_name="a.b", rootdir="/r",
                   work_dir="/w", log_path="/w/log", reports_path="/w/r", command=["true"],
                   partition="batch", account=ACCOUNT, container_image=image)


def test_setup_on_every_node_once_and_a_changed_image_in_the_same_allocation(
    pyxis, tmp_path: Path  # noqa: F811
) -> None:
    image, alias = pyxis["image"], pyxis["alias"]
    name = container_name_for(image, account=ACCOUNT)  # what SlurmExecutor's steps use
    state_file = tmp_path / "work_dirs" / ".slurm_alloc.json"
    mgr, shell = manager(tmp_path, request(tmp_path, image))
    try:
        # run 1: allocate 2 nodes, import on both, warm the mounts, install once (writable)
        state = mgr.ensure()
        assert state is not None and state.nodes == 2
        job = state.job_id
        assert per_node(imports(pyxis, job, name)) == dict.fromkeys(hostnames(job), 1)
        kinds = [a[a.index("--overlap") + 1:] for a in shell.setup_steps()]
        assert [k[0] for k in kinds] == [f"--container-image={enroot_uri(image)}",
                                         f"--container-name={name}",
                                         f"--container-name={name}"]
        assert "--container-writable" in kinds[2] and kinds[2][-1] == INSTALL
        assert all("--container-writable" not in k for k in kinds[:2])
        saved = json.loads(state_file.read_text())
        assert saved["container_runtime"] == "pyxis" and saved["installed"] is True
        assert saved["container_name"] == name and saved["docker_image"] == image
        assert [(c["name"], c["installed"]) for c in saved["containers"]] == [(name, True)]
        # the install step ran in the repo, writable, once per node: a later read-only step
        # of the same named container sees its file on both nodes, and imports nothing
        assert read_installed(job, image, name) == [f"installed in {tmp_path}"] * 2
        assert len(imports(pyxis, job, name)) == 2

        # run 2 (a fresh manager, as a new pytest run): same allocation, no setup step at all
        mgr2, shell2 = manager(tmp_path, request(tmp_path, image))
        again = mgr2.ensure()
        assert again is not None and again.job_id == job
        assert shell2.setup_steps() == []
        assert len(imports(pyxis, job)) == 2

        # run 3, another image: set up under its own name in the SAME allocation
        new_name = container_name_for(alias, account=ACCOUNT)
        assert new_name != name
        mgr3, shell3 = manager(tmp_path, request(tmp_path, alias))
        third = mgr3.ensure()
        assert third is not None and third.job_id == job, "the allocation was replaced"
        assert per_node(imports(pyxis, job, new_name)) == dict.fromkeys(hostnames(job), 1)
        assert len(imports(pyxis, job, name)) == 2  # the old image: not imported again
        saved = json.loads(state_file.read_text())
        assert [(c["name"], c["image"], c["installed"]) for c in saved["containers"]] == [
            (name, image, True), (new_name, alias, True)]
        assert saved["container_name"] == new_name and saved["docker_image"] == alias
        assert read_installed(job, alias, new_name) == [f"installed in {tmp_path}"] * 2
        reread = AllocationState.model_validate(saved)
        assert reread.serves(spec(image)) is None and reread.serves(spec(alias)) is None
        assert "not set up" in (reread.serves(spec("localhost/other:1")) or "")

        # and back to the first image: both are set up, nothing runs
        mgr4, shell4 = manager(tmp_path, request(tmp_path, image))
        assert (mgr4.ensure() or state).job_id == job and shell4.setup_steps() == []
        assert len(imports(pyxis, job)) == 4
    finally:
        if state_file.exists():
            run(["scancel", json.loads(state_file.read_text())["job_id"]], check=False)


def test_a_failed_setup_names_the_image_and_keeps_the_allocation(
    pyxis, tmp_path: Path  # noqa: F811
) -> None:
    missing = "localhost/trtllm-not-in-the-store:0"
    state_file = tmp_path / "work_dirs" / ".slurm_alloc.json"
    mgr, _ = manager(tmp_path, request(tmp_path, missing, nodes=1))
    try:
        with pytest.raises(ExecutionError) as err:
            mgr.ensure()
        text = str(err.value)
        assert f"image {missing}" in text and "failed at the import" in text, text
        assert "srun" in text and "exit code" in text, text
        job = json.loads(state_file.read_text())["job_id"]  # kept: the next run retries
        assert json.loads(state_file.read_text())["containers"] == []

        # an install command that fails: the image is named with the step and its error
        mgr2, _ = manager(tmp_path, request(tmp_path, pyxis["image"], nodes=1,
                                            install="echo no-such-requirement >&2; exit 3"))
        with pytest.raises(ExecutionError) as err:
            mgr2.ensure()
        text = str(err.value)
        assert f"image {pyxis['image']}" in text and "failed at the install step" in text, text
        assert "no-such-requirement" in text, text
        saved = json.loads(state_file.read_text())
        assert saved["job_id"] == job and saved["containers"] == []
    finally:
        if state_file.exists():
            run(["scancel", json.loads(state_file.read_text())["job_id"]], check=False)


# --------------------------------------------------------------------------- no cluster

def test_old_state_files_still_read_and_pyxis_compatibility() -> None:
    old = {"job_id": "7", "container_name": "acct-img-1", "docker_image": "img:1",
           "installed": True, "partition": "batch", "nodes": 2}
    state = AllocationState.model_validate(old)
    [one] = state.containers
    assert (one.name, one.image, one.installed) == ("acct-img-1", "img:1", True)
    assert one.current("pip install -e .")  # install command unknown: installed is trusted
    assert AllocationState.model_validate({"job_id": "8"}).containers == []

    other = AllocationRequest(partition="batch", nodes=2, docker_image="img:2")
    assert "image" in (other.incompatible(state) or "")  # no pyxis: as before, reallocate
    pyxis_req = AllocationRequest(partition="batch", nodes=2, docker_image="img:2",
                                  container_runtime="pyxis")
    assert pyxis_req.incompatible(state) is None  # pyxis: set up in the same allocation
    assert pyxis_req.images == ["img:2"]
    assert AllocationRequest(nodes=3, container_runtime="pyxis").incompatible(state)


def test_setup_mounts_reject_what_pyxis_cannot_express() -> None:
    assert setup_mounts("/repo", ["/data:/d:ro"], "/models") == [
        "/repo:/repo", "/data:/d:ro", "/models:/models:ro"]
    with pytest.raises(ValueError):
        setup_mounts("/a,b")
    with pytest.raises(ValueError):
        setup_mounts("/repo", ["relative:/x"])
