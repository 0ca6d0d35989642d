"""Run a sample suite plainly and through the plugin, and read what each run reported."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).parent / "data"


def copy_suite(name: str, dest: Path, replacements: dict[str, str] | None = None) -> Path:
    target = dest / name
    shutil.copytree(DATA / name, target)
    for path in target.glob("*.py"):
        text = path.read_text(encoding="utf-8")
        for old, new in (replacements or {}).items():
            text = text.replace(old, new)
        path.write_text(text, encoding="utf-8")
    return target


@dataclass
class SuiteRun:
    returncode: int
    stdout: str
    reports: list[dict]
    junit: Path

    def outcomes(self) -> dict[str, list[tuple[str, str]]]:
        """nodeid -> [(when, outcome), ...] in report order."""
        result: dict[str, list[tuple[str, str]]] = {}
        for rep in self.reports:
            result.setdefault(rep["nodeid"], []).append((rep["when"], rep["outcome"]))
        return result


def run_suite(suite: Path, *args: str, env: dict[str, str] | None = None, tag: str = "run",
              timeout: float = 300, cwd: Path | None = None,
              launcher: tuple[str, ...] = ()) -> SuiteRun:
    """pytest in ``cwd`` (default: the suite) with the report recorder and a junit file;
    ``launcher``: a command that starts it (``srun ...``: plain on a cluster node)."""
    dump = suite / f"{tag}.reports.jsonl"
    junit = suite / f"{tag}.junit.xml"
    pythonpath = os.pathsep.join(filter(None, [str(DATA), os.environ.get("PYTHONPATH")]))
    outer = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    full_env = {**outer, "REPORT_DUMP": str(dump), "PYTHONPATH": pythonpath, **(env or {})}
    proc = subprocess.run(
        [*launcher, sys.executable, "-m", "pytest", "-p", "report_recorder", "-rA",
         f"--junitxml={junit}",
         *args],
        cwd=cwd or suite,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    reports = []
    if dump.exists():
        reports = [json.loads(line) for line in dump.read_text(encoding="utf-8").splitlines()]
    return SuiteRun(proc.returncode, proc.stdout + proc.stderr, reports, junit)


_ADDRESS = re.compile(r"0x[0-9a-f]{6,}")  # object addresses differ between any two runs


def without_addresses(value: object) -> object:
    """``value`` (str, or lists of them) with object addresses blanked."""
    if isinstance(value, str):
        return _ADDRESS.sub("0x?", value)
    if isinstance(value, list):
        return [without_addresses(v) for v in value]
    return value


DISPATCH_PROPERTY = "trtllm_slurm_"  # testcase properties only a dispatched run adds


def junit_cases(path: Path) -> list[dict]:
    """Testcases of a junit XML without times, host names and the properties that say
    where a dispatched test ran (``dispatch_properties`` reads those)."""
    root = ET.parse(path).getroot()
    cases = []
    for case in root.iter("testcase"):
        children = []
        for child in case:
            if child.tag == "properties":
                props = [(p.get("name"), p.get("value")) for p in child
                         if not (p.get("name") or "").startswith(DISPATCH_PROPERTY)]
                if props:
                    children.append(("properties", {}, props))
                continue
            attrs = {k: v for k, v in child.attrib.items() if k not in ("time",)}
            text = _ADDRESS.sub("0x?", (child.text or "").strip())
            children.append((child.tag, {k: _ADDRESS.sub("0x?", v) for k, v in attrs.items()}, text))
        attrs = {k: v for k, v in case.attrib.items() if k != "time"}
        cases.append({"attrs": attrs, "children": children})
    return sorted(cases, key=lambda c: (c["attrs"].get("classname", ""), c["attrs"].get("name", "")))


def dispatch_properties(path: Path) -> dict[str, dict[str, str]]:
    """testcase name -> the properties a dispatched run adds (job id, nodes, ...)."""
    root = ET.parse(path).getroot()
    return {case.get("name", ""): {p.get("name", ""): p.get("value", "")
                                   for p in case.iter("property")
                                   if p.get("name", "").startswith(DISPATCH_PROPERTY)}
            for case in root.iter("testcase")}


def suite_properties(path: Path) -> list[tuple[str, str]]:
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    props = suite.find("properties") if suite is not None else None
    return [(p.get("name", ""), p.get("value", "")) for p in props] if props is not None else []
