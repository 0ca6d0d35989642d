"""options.py: the option table, precedence, validation, markers and the zero-cost default."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import pytest_trtllm_slurm.controller.options as options
from pytest_trtllm_slurm.controller.options import BY_NAME, MARKERS, OPTIONS, build_settings, coerce
from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.planning.settings import ClusterConfig, ClustersFile

pytest_plugins = ["pytester"]

EXAMPLES = Path(__file__).resolve().parents[1] / "conftest_examples"

SETTINGS_PROBE = """
from pytest_trtllm_slurm.controller.options import resolve_settings

def pytest_collection_finish(session):
    print("SETTINGS=" + resolve_settings(session.config).model_dump_json())
    print("PLAN_PLUGIN=%s" % session.config.pluginmanager.has_plugin("trtllm-slurm-plan"))
"""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No TRTLLM_SLURM_* from the developer's shell, no ~/.config clusters file."""
    import os

    for name in list(os.environ):
        if name.startswith("TRTLLM_SLURM_") or name.endswith("_CONFIG_FOLDER"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def probe(result: pytest.RunResult) -> dict[str, Any]:
    for line in result.outlines:
        if line.startswith("SETTINGS="):
            return dict(json.loads(line.removeprefix("SETTINGS=")))
    raise AssertionError("no SETTINGS line in:\n" + "\n".join(result.outlines + result.errlines))


# --------------------------------------------------------------------------- the table


def test_names_follow_the_documented_rule() -> None:
    names = ("slurm_cluster", "slurm_partition", "device_type", "remote", "perf_config_dir",
             "config")
    assert {o.name: (o.ini, o.env) for o in OPTIONS if o.name in names} == {
        "slurm_cluster": ("trtllm_slurm_cluster", "TRTLLM_SLURM_CLUSTER"),
        "slurm_partition": ("trtllm_slurm_partition", "TRTLLM_SLURM_PARTITION"),
        "device_type": ("trtllm_device_type", "TRTLLM_SLURM_DEVICE_TYPE"),
        "remote": ("trtllm_remote", "TRTLLM_SLURM_REMOTE"),
        "perf_config_dir": ("trtllm_perf_config_dir", "TRTLLM_SLURM_PERF_CONFIG_DIR"),
        "config": ("trtllm_config", "TRTLLM_SLURM_CONFIG"),
    }
    for table in ("ini", "env", "flag", "field"):
        values = [getattr(o, table) for o in OPTIONS if getattr(o, table)]
        assert len(values) == len(set(values)), f"duplicate {table}"


def test_time_formats_documented_once() -> None:
    import pytest_trtllm_slurm.planning.durations as durations

    assert options.TIME_FORMATS == durations.TIME_FORMATS


def test_registering_options_imports_no_pydantic() -> None:
    import subprocess
    import sys

    code = ("import sys, pytest_trtllm_slurm.controller.options; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'yaml')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_defaults_build_default_settings() -> None:
    settings, clusters = build_settings(lambda opt: (None, None), bases={}, rootdir=Path("/"))
    assert settings.model_dump() == {
        **settings.model_dump(),
        "remote": False, "scenario": "auto", "dispatch": "needed", "monitor_timeout_seconds": 3600,
        "persistent": True, "max_retries": 1, "unsatisfied": "skip",
        "hang_patterns": ["hang detected"], "partition": None,
    }
    assert clusters.clusters == {}


@pytest.mark.parametrize(
    "name, value, source, expected",
    [
        ("remote", "yes", "env", True), ("remote", "0", "env", False),
        ("remote", True, "ini", True),
        ("max_retries", "3", "env", 3), ("scenario", "local_slurm", "cli", "local_slurm"),
        ("slurm_time_limit", "90m", "env", "01:30:00"), ("slurm_time_limit", "2-00:00:00", "ini",
                                                          "2-00:00:00"),
        ("monitor_timeout", "10m", "cli", 600), ("hang_pattern", "a\n b \n\n", "env", ["a", "b"]),
        ("hang_pattern", ["x", "y"], "cli", ["x", "y"]),
    ],
)
def test_coerce(name: str, value: Any, source: str, expected: Any) -> None:
    assert coerce(BY_NAME[name], value, source) == expected


def test_coerce_paths_are_anchored() -> None:
    assert coerce(BY_NAME["work_dir"], "out", "cli", Path("/base")) == "/base/out"
    assert coerce(BY_NAME["work_dir"], "/abs", "ini", Path("/base")) == "/abs"


@pytest.mark.parametrize(
    "name, value, source, needles",
    [
        ("remote", "maybe", "env", ["env TRTLLM_SLURM_REMOTE", "'maybe'", "true/false"]),
        ("max_retries", "-1", "cli", ["--trtllm-max-retries", "'-1'", "non-negative integer"]),
        ("scenario", "cloud", "ini", ["ini trtllm_scenario", "'cloud'", "remote_slurm"]),
        ("slurm_time_limit", "soon", "env", ["TRTLLM_SLURM_TIME_LIMIT", "'soon'", "HH:MM:SS"]),
        ("monitor_timeout", "0s", "cli", ["--trtllm-monitor-timeout", "zero"]),
        ("slurm_partition", "  ", "env", ["TRTLLM_SLURM_PARTITION", "non-empty"]),
    ],
)
def test_coerce_errors(name: str, value: Any, source: str, needles: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        coerce(BY_NAME[name], value, source)
    for needle in needles:
        assert needle in str(info.value)


def layered(**layers: dict[str, Any]):  # type: ignore[no-untyped-def]
    """A raw() for build_settings from {source: {name: value}} layers, first source wins."""
    def raw(opt: options.Opt) -> tuple[Any, str | None]:
        for source in ("cli", "env", "ini"):
            if opt.name in layers.get(source, {}):
                return layers[source][opt.name], source
        return None, None
    return raw


def fake_clusters(**fields: Any):  # type: ignore[no-untyped-def]
    def load(path: Path | None, rootdir: Path) -> ClustersFile:
        return ClustersFile(path="c.toml", clusters={"dev": ClusterConfig(name="dev", **fields)})
    return load


CLUSTER = {"partition": "c_part", "account": "c_acct", "time_limit": "2h",
           "container_image": "c_img", "device_type": "H100"}


@pytest.mark.parametrize(
    "layers, expected",
    [
        ({}, ("c_part", "c_acct", "02:00:00", "c_img", "H100")),
        ({"ini": {"slurm_partition": "i", "slurm_time_limit": "1h"}},
         ("i", "c_acct", "01:00:00", "c_img", "H100")),
        ({"ini": {"slurm_partition": "i"}, "env": {"slurm_partition": "e", "device_type": "B200"}},
         ("e", "c_acct", "02:00:00", "c_img", "B200")),
        ({"ini": {"slurm_partition": "i"}, "env": {"slurm_partition": "e"},
          "cli": {"slurm_partition": "c", "container_image": "x"}},
         ("c", "c_acct", "02:00:00", "x", "H100")),
    ],
)
def test_precedence_unit(layers: dict[str, dict[str, Any]], expected: tuple[str, ...]) -> None:
    layers = {**layers, "ini": {"slurm_cluster": "dev", **layers.get("ini", {})}}
    settings, _ = build_settings(layered(**layers), bases={}, rootdir=Path("/"),
                                 load_clusters=fake_clusters(**CLUSTER))
    got = (settings.partition, settings.account, settings.time_limit, settings.container_image,
           settings.device_type)
    assert got == expected


def test_remote_implied_by_cli_cluster_unless_explicit() -> None:
    def build(**layers: dict[str, Any]) -> bool:
        settings, _ = build_settings(layered(**layers), bases={}, rootdir=Path("/"),
                                     load_clusters=fake_clusters())
        return settings.remote

    assert build(cli={"slurm_cluster": "dev"}) is True
    assert build(cli={"device_type": "H200"}) is True
    assert build(env={"slurm_cluster": "dev"}) is False
    assert build(cli={"slurm_cluster": "dev"}, env={"remote": "0"}) is False
    assert build(ini={"remote": True}) is True


def test_bad_cluster_value_names_the_file(tmp_path: Path) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text('[clusters.dev]\ntime_limit = "forever"\n')
    with pytest.raises(ConfigError) as info:
        build_settings(layered(cli={"slurm_cluster": "dev", "config": str(toml)}),
                       bases={}, rootdir=tmp_path)
    assert str(toml) in str(info.value) and "clusters.dev.time_limit" in str(info.value)
    assert "'forever'" in str(info.value)


# --------------------------------------------------------------------------- end to end


def test_help_lists_every_option(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    assert result.ret == 0
    text = result.stdout.str()
    for opt in OPTIONS:
        for flag in (opt.flag, opt.false_flag):
            if flag:
                assert flag in text, flag
        assert opt.ini in text, opt.ini
        assert opt.env in text.replace("\n", " ").replace("  ", ""), opt.env


def test_markers_are_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    for line in MARKERS:
        result.stdout.fnmatch_lines([f"@pytest.mark.{line.split(':')[0]}*"])


def test_markers_pass_strict_markers(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.skip_less_device(0)
        @pytest.mark.skip_less_device_memory(0)
        @pytest.mark.skip_less_host_memory(0)
        @pytest.mark.skip_less_mpi_world_size(1)
        @pytest.mark.skip_device_not_contain(["H"])
        @pytest.mark.trtllm_slurm(devices=0, local=True)
        def test_marked():
            pass
        """
    )
    pytester.runpytest("--strict-markers").assert_outcomes(passed=1)


def test_suite_registering_markers_itself_works(pytester: pytest.Pytester) -> None:
    shutil.copytree(EXAMPLES, pytester.path, dirs_exist_ok=True)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    outcomes = result.parseoutcomes()
    assert result.ret == 0, result.stdout.str()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("errors", 0) == 0
    assert outcomes.get("passed", 0) >= 6
    plan = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--trtllm-plan")
    assert plan.ret == 0, plan.stdout.str() + plan.stderr.str()
    plan.stdout.fnmatch_lines(["*test_e2e?aggr-llama_8b_fp8-tp4pp2?: 8 x any GPU = 2 node(s) x 4*"])


def test_precedence_end_to_end(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeconftest(SETTINGS_PROBE)
    pytester.makepyfile("def test_a():\n    pass\n")
    pytester.path.joinpath("clusters.toml").write_text(
        '[clusters.dev]\npartition = "c_part"\naccount = "c_acct"\ntime_limit = "2h"\n'
        'container_image = "c_img"\ndevice_type = "H100"\n'
    )
    pytester.makeini(
        "[pytest]\ntrtllm_slurm_cluster = dev\ntrtllm_config = clusters.toml\n"
        "trtllm_slurm_account = i_acct\ntrtllm_slurm_partition = i_part\n"
        "trtllm_container_image = i_img\ntrtllm_work_dir = wd\n"
    )
    monkeypatch.setenv("TRTLLM_SLURM_PARTITION", "e_part")
    monkeypatch.setenv("TRTLLM_SLURM_CONTAINER_IMAGE", "e_img")
    result = pytester.runpytest("--collect-only", "-q", "-s", "--trtllm-container-image=x_img")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    got = probe(result)
    assert got["time_limit"] == "02:00:00" and got["device_type"] == "H100"  # cluster file
    assert got["account"] == "i_acct"  # ini over cluster file
    assert got["partition"] == "e_part"  # env over ini
    assert got["container_image"] == "x_img"  # CLI over env
    assert got["work_dir"] == str(pytester.path / "wd")  # ini paths: relative to the ini file
    assert got["remote"] is False and got["config_path"] == str(pytester.path / "clusters.toml")


@pytest.mark.parametrize(
    "args, env, ini, needles",
    [
        (["--trtllm-plan"], {"TRTLLM_SLURM_MAX_RETRIES": "many"}, "",
         ["env TRTLLM_SLURM_MAX_RETRIES", "'many'", "non-negative integer"]),
        (["--trtllm-plan", "--slurm-time-limit=soon"], {}, "",
         ["--slurm-time-limit", "'soon'", "HH:MM:SS"]),
        (["--trtllm-plan"], {}, "trtllm_monitor_timeout = 90\n",
         ["ini trtllm_monitor_timeout", "'90'"]),
        ([], {}, "trtllm_remote = maybe\n", ["ini trtllm_remote", "maybe"]),
        ([], {"TRTLLM_SLURM_PLAN": "perhaps"}, "", ["env TRTLLM_SLURM_PLAN", "perhaps"]),
    ],
)
def test_bad_values_are_usage_errors(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                     args: list[str], env: dict[str, str], ini: str,
                                     needles: list[str]) -> None:
    pytester.makepyfile("def test_a():\n    pass\n")
    pytester.makeini("[pytest]\n" + ini)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "Traceback" not in err + result.stdout.str()
    for needle in needles:
        assert needle in err


def test_dispatch_off_costs_nothing(pytester: pytest.Pytester,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Off by default: no per-item work, no clusters file read, no plan plugin."""
    import pytest_trtllm_slurm.planning.requirements as requirements
    import pytest_trtllm_slurm.planning.settings as config_module

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("work done with dispatch off")

    monkeypatch.setattr(requirements, "size_item", boom)
    monkeypatch.setattr(requirements, "size_marks", boom)
    monkeypatch.setattr(requirements.PerfSources, "from_settings", boom)
    monkeypatch.setattr(config_module, "load_clusters_file", boom)
    pytester.path.joinpath("trtllm-slurm.toml").write_text("[[[ not toml")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.skip_less_device(1000)
        @pytest.mark.parametrize("x", range(3))
        def test_a(request, x):
            assert not request.config.pluginmanager.has_plugin("trtllm-slurm-plan")
        """
    )
    pytester.runpytest("--strict-markers").assert_outcomes(passed=3)


def test_is_active(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    config = pytester.parseconfig()
    assert options.is_active(config, {}) is False
    assert options.is_active(config, {"TRTLLM_SLURM_REMOTE": "1"}) is True
    assert options.is_active(config, {"TRTLLM_SLURM_PLAN_JSON": "p.json"}) is True
    assert options.is_active(config, {"TRTLLM_SLURM_CLUSTER": "dev"}) is False
    assert options.is_active(pytester.parseconfig("--slurm-cluster=dev"), {}) is True
    assert options.is_active(pytester.parseconfig("--slurm-cluster=dev"),
                             {"TRTLLM_SLURM_REMOTE": "off"}) is False
    assert options.is_active(pytester.parseconfig("--trtllm-plan"), {}) is True
    assert options.remote_requested(pytester.parseconfig("--trtllm-plan"), {}) is False
    assert options.remote_requested(pytester.parseconfig("--device-type=H200"), {}) is True


@pytest.mark.parametrize(
    "args, env, ini",
    [([], {}, ""), (["--trtllm-remote"], {}, ""), (["--slurm-cluster=dev"], {}, ""),
     (["--slurm-cluster=dev"], {"TRTLLM_SLURM_REMOTE": "no"}, ""), ([], {}, "trtllm_remote=1\n"),
     (["--device-type=H200"], {}, "trtllm_remote=false\n"), ([], {"TRTLLM_SLURM_REMOTE": "y"}, "")],
)
def test_remote_requested_agrees_with_settings(pytester: pytest.Pytester, args: list[str],
                                               env: dict[str, str], ini: str) -> None:
    pytester.makeini("[pytest]\n" + ini)
    pytester.path.joinpath("trtllm-slurm.toml").write_text("[clusters.dev]\n")
    config = pytester.parseconfig(*args)
    settings, _ = build_settings(lambda opt: options._first(config, opt, env), bases={},
                                 rootdir=pytester.path)
    assert options.remote_requested(config, env) is settings.remote


def test_plan_plugin_only_when_asked(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(SETTINGS_PROBE)
    pytester.makepyfile("def test_a():\n    pass\n")
    plain = pytester.runpytest("--collect-only", "-s")
    assert "PLAN_PLUGIN=False" in plain.stdout.str()
    planned = pytester.runpytest("--trtllm-plan", "-s")
    assert planned.ret == 0 and "PLAN_PLUGIN=True" in planned.stdout.str()
