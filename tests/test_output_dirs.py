"""The pieces of per-batch output paths and suite time limits, without a cluster: a batch's
walltime from its tests' limits, and what the collector brings back from a work dir
(through the real LocalShell) and what it refuses."""

from __future__ import annotations

import os
from pathlib import Path

from pytest_trtllm_slurm.controller.output_dirs import (
    OutputCollector,
    OutputOption,
    mirror,
    worker_tokens,
)
from pytest_trtllm_slurm.planning.walltime import STARTUP_SECONDS, batch_walltime
from pytest_trtllm_slurm.transport.shell import LocalShell


def test_walltime_grows_to_the_sum_of_the_limits_within_the_partition() -> None:
    wall = batch_walltime([2400, 2400, None], time_limit=None, monitor_seconds=3600,
                          partition_limit=None)
    assert (wall.time_limit, wall.monitor_seconds) == (4800 + STARTUP_SECONDS,) * 2
    capped = batch_walltime([2400, 2400], time_limit=None, monitor_seconds=3600,
                            partition_limit=4000)
    assert (capped.time_limit, capped.capped_at) == (4000, 4000)
    # enough already: nothing asked for; no limits: nothing changes
    assert batch_walltime([60], time_limit=7200, monitor_seconds=3600,
                          partition_limit=None).time_limit is None
    assert batch_walltime([None, None], time_limit=None, monitor_seconds=3600,
                          partition_limit=None).monitor_seconds == 3600


def test_worker_tokens_mirror_the_users_paths_below_the_work_dir(tmp_path: Path) -> None:
    out = OutputOption.of("--output-dir", str(tmp_path / "out"))
    xml = OutputOption.of("--periodic-junit-xmlpath", str(tmp_path / "out" / "results.xml"))
    assert (out.directory, xml.directory) == (True, False)
    tokens = worker_tokens([out, xml], "/w/b1")
    assert tokens == [f"--output-dir=/w/b1/outputs{tmp_path}/out",
                      f"--periodic-junit-xmlpath=/w/b1/outputs{tmp_path}/out/results.xml",
                      f"--trtllm-worker-outputs=/w/b1/outputs{tmp_path}/out"]


def _batch(work: Path, local: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = Path(mirror(str(work), str(local))) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_collector_brings_files_back_keeps_the_controllers_and_reports_conflicts(
        tmp_path: Path) -> None:
    out = tmp_path / "out"
    said: list[str] = []
    collector = OutputCollector([OutputOption.of("--output-dir", str(out)),
                                 OutputOption.of("--csv", str(out / "report.csv"))], said.append)
    for name, text in (("b1", "one"), ("b2", "two")):
        _batch(tmp_path / name, out, {"a/log.txt": f"{name} log", "shared.txt": text,
                                      "report.csv": f"{name} rows"})
        collector.collect(LocalShell(), str(tmp_path / name), name)
    assert (out / "a" / "log.txt").read_text() == "b1 log"  # first kept
    assert (out / "a" / "log.txt.b2").read_text() == "b2 log"
    assert (out / "shared.txt").read_text() == "one"
    assert (out / "shared.txt.b2").read_text() == "two"
    assert not (out / "report.csv").exists()  # the controller's own writer's file
    assert len(said) == 2 and all("output file conflict" in s for s in said), said
    assert oct((out / "shared.txt").stat().st_mode & 0o777) == "0o600"


def test_collector_takes_nothing_outside_the_folders_and_follows_no_link(tmp_path: Path
                                                                         ) -> None:
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    elsewhere.mkdir()
    work = tmp_path / "b1"
    root = Path(mirror(str(work), "/"))
    (root / str(elsewhere).lstrip("/")).mkdir(parents=True)
    (root / str(elsewhere).lstrip("/") / "x.txt").write_text("not asked for")
    _batch(work, out, {"ok.txt": "fine"})
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    os.symlink(secret, Path(mirror(str(work), str(out))) / "link.txt")
    said: list[str] = []
    OutputCollector([OutputOption.of("--output-dir", str(out))], said.append).collect(
        LocalShell(), str(work), "b1")
    assert sorted(p.name for p in out.iterdir()) == ["ok.txt"], said
    assert list(elsewhere.iterdir()) == []
