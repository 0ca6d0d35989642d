"""A perf-sanity style test_e2e: ids are <prefix>-<config>[-<server>], GPUs come from YAML."""

import os
from pathlib import Path

import pytest
import yaml

CONFIG_FOLDER = Path(os.environ.get("AGG_CONFIG_FOLDER") or Path(__file__).parent / "perf_configs")


def _cases() -> list[str]:
    cases = []
    for path in sorted(CONFIG_FOLDER.glob("*.yaml")):
        names = [s["name"] for s in yaml.safe_load(path.read_text())["server_configs"]]
        cases.append(f"aggr-{path.stem}")  # all servers: the largest decides
        cases.extend(f"aggr-{path.stem}-{name}" for name in names)
    return cases


@pytest.mark.parametrize("perf_sanity_test_case", _cases())
def test_e2e(perf_sanity_test_case, device_count):
    _, config, *server = perf_sanity_test_case.split("-")
    data = yaml.safe_load((CONFIG_FOLDER / f"{config}.yaml").read_text())
    servers = [s for s in data["server_configs"] if not server or s["name"] == "-".join(server)]
    assert servers, f"no server config for {perf_sanity_test_case}"
    gpus = max(
        s.get("tensor_parallel_size", 1) * s.get("pipeline_parallel_size", 1)
        * s.get("context_parallel_size", 1)
        for s in servers
    )
    if gpus > device_count:
        pytest.skip(f"{perf_sanity_test_case} needs {gpus} GPUs, found {device_count}")
    assert gpus >= 1
