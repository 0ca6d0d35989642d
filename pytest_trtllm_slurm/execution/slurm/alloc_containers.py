"""Named pyxis containers set up once per persistent allocation (an image import takes
minutes): imported, mounts warmed, installed once; later steps use them by name."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from pytest_trtllm_slurm.errors import ExecutionError
from pytest_trtllm_slurm.execution.render.containers import (
    parse_mount,
    pyxis_setup_argvs,
)
from pytest_trtllm_slurm.execution.slurm.jobs import SlurmJobs
from pytest_trtllm_slurm.planning.settings import with_mounts

SETUP_TIMEOUT = 3600  # an import of a large image over a slow registry link takes a while


class ContainerSetup(BaseModel):
    """One named container of the allocation, as the state file records it."""

    model_config = ConfigDict(extra="ignore")

    name: str
    image: str
    install_command: str | None = None
    installed: bool = False
    install_known: bool = True  # False: an older state file's container (command unknown)

    def current(self, install_command: str | None) -> bool:
        """Set up completely, with the install command asked for now (a changed command
        runs again in the same container; the import is then skipped by pyxis)."""
        return self.installed and (not self.install_known
                                   or self.install_command == install_command)


def setup_mounts(repo: str, extra: Sequence[str] = (), models_root: str | None = None
                 ) -> list[str]:
    """What the setup steps mount: the repo (the install step runs there), the cluster's
    mounts, the models root read-only, each path once; ValueError for what pyxis cannot."""
    out = list(with_mounts([f"{repo}:{repo}"], [
        *extra, *([f"{models_root}:{models_root}:ro"] if models_root else [])]))
    for mount in out:
        parse_mount(mount)
        if "," in mount:
            raise ValueError(f"mount {mount!r}: ',' separates --container-mounts entries")
    return out


def set_up_container(jobs: SlurmJobs, job_id: str, nodes: int, image: str, name: str, *,
                     mounts: Sequence[str] = (), install_command: str | None = None,
                     workdir: str | None = None, timeout: float = SETUP_TIMEOUT
                     ) -> ContainerSetup:
    """Run the setup steps (import on every node, warm the mounts, install once); a failed
    one raises ExecutionError naming the image, the container and srun's complaint."""
    steps = pyxis_setup_argvs(job_id, nodes, image, name, mounts,
                              install_command=install_command, workdir=workdir)
    labels = ["import", *(["mount warm-up"] if mounts else []),
              *(["install step"] if install_command else [])]
    for what, argv in zip(labels, steps, strict=True):
        res = jobs.run(argv, timeout=timeout)
        if not res.ok:
            raise ExecutionError(f"container setup of image {image} (container {name}) in "
                                 f"allocation {job_id} failed at the {what}: {res.describe()}")
    return ContainerSetup(name=name, image=image, install_command=install_command,
                          installed=True)
