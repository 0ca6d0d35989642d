"""Checks of the --trtllm-timeline files, shared by the local and the Slurm tests."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path


def check_trace(path: Path, summary: dict) -> list[dict]:
    """Trace-event format: complete events with a start and a duration; metadata names
    the tracks; every test is a slice on each GPU track of its batch, inside the batch's
    slice there. Returns one slice per test."""
    data = json.loads(path.read_text())
    events = data["traceEvents"]
    assert all(e["ph"] in ("X", "M") for e in events)
    slices = [e for e in events if e["ph"] == "X"]
    for e in slices:
        assert isinstance(e["ts"], int) and isinstance(e["dur"], int) and e["dur"] >= 0, e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int) and e["name"], e
    named = {(e["pid"], e.get("tid")) for e in events if e["ph"] == "M"}
    assert all((e["pid"], None) in named and (e["pid"], e["tid"]) in named
               for e in slices if e["cat"] not in ("queue", "gate"))
    batches = [e for e in slices if e["cat"] == "batch"]
    assert {e["args"]["job_id"] for e in batches} == {b["job_id"] for b in summary["batches"]}
    tests = [e for e in slices if e["cat"] == "test"]
    tracks = {}  # job id -> its batch's tracks (one per GPU it held)
    for batch in batches:
        tracks.setdefault(batch["args"]["job_id"], []).append((batch["pid"], batch["tid"]))
    for name in {e["name"] for e in tests}:  # each test once on each GPU of its batch
        mine = [e for e in tests if e["name"] == name]
        assert sorted((e["pid"], e["tid"]) for e in mine) == sorted(
            tracks[mine[0]["args"]["job_id"]]), name
    for test in tests + [e for e in slices if e["cat"] == "startup"]:
        (parent,) = [b for b in batches if b["args"]["job_id"] == test["args"]["job_id"]
                     and (b["pid"], b["tid"]) == (test["pid"], test["tid"])]
        assert parent["ts"] <= test["ts"], (parent, test)
        assert test["ts"] + test["dur"] <= parent["ts"] + parent["dur"], (parent, test)
    return list({e["name"]: e for e in tests}.values())


def check_svg(path: Path, summary: dict) -> None:
    """It parses as XML, needs nothing from the network, and holds one group per batch."""
    text = path.read_text()
    root = ET.fromstring(text)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert "http" not in text.replace("http://www.w3.org/2000/svg", "")
    assert "<script" not in text
    groups = root.findall(".//{http://www.w3.org/2000/svg}g[@class='batch']")
    assert sorted(g.get("id") for g in groups) == sorted(
        f"batch-{b['job_id']}" for b in summary["batches"])
