"""What the controller does with each record a batch wrote: one ``on_<type>`` method per
record type of ``node.records`` (tests/test_record_protocol.py keeps them in step)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pytest_trtllm_slurm.controller.artefacts import prefix_mapper
from pytest_trtllm_slurm.controller.replay import JobContext, Replayer
from pytest_trtllm_slurm.planning.jobspec import JobSpec

# a record as ``records.check_line`` checked it: the plain dict of its line, where a key
# the record may leave out is read with its model's default
Record = dict[str, Any]


class BatchState(Protocol):
    """What a batch's records say about the batch itself (``run_loop.RunningBatch``)."""

    spec: JobSpec  # its rootdir: where the batch ran (a remote cluster's checkout)
    collect_errors: list[str]
    missing: dict[str, str]  # nodeid -> the target's rootdir
    session_finished: bool


@dataclass(slots=True)
class Arrival:
    """Where a record came from: its batch, where the job ran."""

    batch: BatchState
    ctx: JobContext


class RecordHandlers:
    """Batch records go to the batch's state, test records to the ``Replayer``."""

    def __init__(self, replayer: Replayer, after_test: Callable[[], None]) -> None:
        self.replayer = replayer
        self.after_test = after_test  # -x / --maxfail: checked after each test, as pytest does
        # record type -> its handler, bound once (not a name made and looked up per record)
        self._on: dict[str, Callable[[Any, Arrival], None]] = {}

    def dispatch(self, record: Record, came: Arrival) -> None:
        kind = record["type"]
        handler = self._on.get(kind)
        if handler is None:
            handler = self._on[kind] = getattr(self, "on_" + kind)
        handler(record, came)

    # -- the tests' own records: replayed into the local items --------------
    def on_start(self, record: Record, came: Arrival) -> None:
        self.replayer.start(record["nodeid"])

    def on_report(self, record: Record, came: Arrival) -> None:
        self._report(record["data"], came)

    def on_item(self, record: Record, came: Arrival) -> None:
        """A test's reports and its end in one line, replayed as the lines it stands for."""
        for data in record.get("reports", ()):
            self._report(data, came)
        if record.get("finish", False):
            self.on_finish(record, came)
        if record.get("done", False):
            self.replayer.done(record["nodeid"], came.ctx)

    def _report(self, data: dict[str, Any], came: Arrival) -> None:
        longrepr = data.get("longrepr")
        if isinstance(longrepr, list) and longrepr and isinstance(longrepr[0], str):
            # a skip's (path, lineno, reason): the path where the user's rootdir is, as in
            # a plain run (the terminal's "SKIPPED [1] file:line" and junit show it)
            local = prefix_mapper(came.batch.spec.rootdir,
                                  str(self.replayer.config.rootpath))(longrepr[0])
            data = {**data, "longrepr": [local, *longrepr[1:]]}
        self.replayer.report(data, came.ctx)

    def on_finish(self, record: Record, came: Arrival) -> None:
        self.replayer.finish(record["nodeid"])
        self.after_test()

    def on_done(self, record: Record, came: Arrival) -> None:
        self.replayer.done(record["nodeid"], came.ctx)

    def on_warning(self, record: Record, came: Arrival) -> None:
        if record["when"] == "runtest":  # config/collect warnings were seen by the local collection
            self.replayer.warning(record)

    def on_xml_attribute(self, record: Record, came: Arrival) -> None:
        self.replayer.xml_attribute(record["nodeid"], record["name"], record["value"])

    def on_suite_property(self, record: Record, came: Arrival) -> None:
        self.replayer.suite_property(came.ctx.job_id, record["name"], record["value"])

    # -- the batch's records: kept for when its job ends ---------------------
    def on_missing(self, record: Record, came: Arrival) -> None:
        rootdir = record.get("rootdir", "?")
        for nodeid in record["nodeids"]:
            came.batch.missing[nodeid] = rootdir

    def on_collect_error(self, record: Record, came: Arrival) -> None:
        data = record["data"]
        longrepr = data.get("longrepr")
        text = longrepr if isinstance(longrepr, str) else json.dumps(longrepr)[:2000]
        came.batch.collect_errors.append(
            f"collection error on the target in {data.get('nodeid', '?')}: {text}")

    def on_session_finish(self, record: Record, came: Arrival) -> None:
        came.batch.session_finished = True
