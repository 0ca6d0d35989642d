"""Reading a case's log (pure): summary by workflow, success/failure patterns, metric checks;
``scan_log`` reads by offset and keeps a bounded part, so no log is ever held whole."""

from __future__ import annotations

import math
import operator
import re
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pytest_trtllm_slurm.errors import ConfigError

HEAD_LINES = 50  # seed: "read the first 50 lines to catch early errors"
TAIL_LINES = 100  # seed: "read the last 100 lines of the output log"
CUSTOM_LINES = 10  # seed: custom workflow reports its last 10 lines
MAX_LINE = 4096  # longer lines are cut (a progress bar without newlines)
CHUNK = 1 << 20

# log prefixes TensorRT-LLM and launchers put before a message (stripped before parsing)
_PREFIXES = re.compile(
    r"^(?:\[\d+,\d+\]<std(?:out|err)>:\s*)?"  # mpirun --tag-output
    r"(?:\[[\d/:\-. ]+\]\s*\[TRT-LLM\]\s*(?:\[RANK \d+\]\s*)?\[[A-Z]\]\s*"  # [ts] [TRT-LLM] [I]
    r"|\[TensorRT-LLM\](?:\[[A-Z]+\])?\s*)?"  # [TensorRT-LLM][INFO]
)
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"

_PYTEST_COUNT = re.compile(
    r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected|warnings?|rerun)\b"
)
_PYTEST_BANNER = re.compile(
    rf"^=+ (?P<body>.+?) in (?P<secs>{_NUMBER})s(?: \([^)]*\))? =+$"
)
_PYTEST_QUIET = re.compile(
    rf"^(?P<body>(?:\d+ \w+|no tests ran)(?:, \d+ \w+)*) in (?P<secs>{_NUMBER})s(?: \([^)]*\))?$"
)

_ACCURACY = (
    # tensorrt_llm/evaluate/mmlu.py
    re.compile(rf"(?P<task>\S+) weighted average accuracy: (?P<value>{_NUMBER})"
               r"(?: \((?P<samples>\d+)\))?"),
    # tensorrt_llm/evaluate/lm_eval.py
    re.compile(rf"lm-eval (?P<task>\S+) average accuracy: (?P<value>{_NUMBER})"),
    # anything else that says "<task> ... accuracy: N"
    re.compile(rf"(?P<task>[\w.\-]+)(?: [\w.\-]+)*? accuracy: (?P<value>{_NUMBER})\s*%?\s*$",
               re.IGNORECASE),
)

_PERF_HEADER = "PERFORMANCE OVERVIEW"
_PERF_METRIC = re.compile(rf"^(?P<name>[^:]*\S)\s*:\s+(?P<value>{_NUMBER})\s*$")
_RULE = re.compile(r"^=+\s*$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

# out-of-memory signatures, consulted only when the command failed
OOM_PATTERNS = ("CUDA out of memory", "OutOfMemoryError", "CUDA error: out of memory",
                "std::bad_alloc", "MemoryError", "oom-kill", "Out Of Memory")
_OOM = re.compile("|".join(re.escape(p) for p in OOM_PATTERNS), re.IGNORECASE)


def strip_prefix(line: str) -> str:
    """The message of a log line without TensorRT-LLM's / mpirun's prefix."""
    return _PREFIXES.sub("", line, count=1).strip()


def compile_patterns(patterns: Iterable[str], what: str) -> list[re.Pattern[str]]:
    """User patterns as regular expressions (searched per line); a bad one is a ConfigError."""
    out = []
    for text in patterns:
        try:
            out.append(re.compile(text))
        except re.error as exc:
            raise ConfigError(f"{what} {text!r}: not a valid regular expression ({exc}); "
                              "escape special characters such as ( ) [ ] . * with \\") from None
    return out


@dataclass
class PytestSummary:
    line: str
    counts: dict[str, int]
    seconds: float | None


def parse_pytest_summary(line: str) -> PytestSummary | None:
    """pytest's final line (``== 3 passed, 1 failed in 1.2s ==`` or ``3 passed in 1.2s``)."""
    text = line.strip()
    match = _PYTEST_BANNER.match(text) or _PYTEST_QUIET.match(text)
    if not match:
        return None
    body = match.group("body")
    counts: dict[str, int] = {}
    for number, word in _PYTEST_COUNT.findall(body):
        key = {"error": "errors", "warning": "warnings"}.get(word, word)
        counts[key] = counts.get(key, 0) + int(number)
    if not counts and "no tests ran" not in body:
        return None
    return PytestSummary(line=text.strip("= ").strip(), counts=counts,
                         seconds=float(match.group("secs")))


@dataclass
class Accuracy:
    task: str
    value: float
    samples: int | None
    line: str


def parse_accuracy(line: str) -> Accuracy | None:
    """One trtllm-eval accuracy line, or None."""
    message = strip_prefix(line)
    for pattern in _ACCURACY:
        match = pattern.search(message)
        if match:
            samples = match.groupdict().get("samples")
            return Accuracy(task=match.group("task"), value=float(match.group("value")),
                            samples=int(samples) if samples else None, line=message)
    return None


@dataclass
class PatternHit:
    pattern: str
    line_no: int
    line: str


@dataclass
class LogScan:
    """What one pass over a log found (bounded memory)."""

    workflow: str = "custom"
    success: list[re.Pattern[str]] = field(default_factory=list)
    failure: list[re.Pattern[str]] = field(default_factory=list)
    lines: int = 0
    head: list[str] = field(default_factory=list)
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    pytest: PytestSummary | None = None
    accuracy: list[Accuracy] = field(default_factory=list)
    performance: dict[str, float] = field(default_factory=dict)  # the last complete block
    performance_blocks: int = 0
    success_hits: dict[str, PatternHit] = field(default_factory=dict)
    failure_hits: dict[str, PatternHit] = field(default_factory=dict)
    oom: PatternHit | None = None
    _block: dict[str, float] | None = None

    def feed(self, raw: str) -> None:
        text = _ANSI.sub("", raw) if "\x1b" in raw else raw
        line = text if len(text) <= MAX_LINE else text[:MAX_LINE] + " [...]"
        self.lines += 1
        if len(self.head) < HEAD_LINES:
            self.head.append(line)
        self.tail.append(line)
        for patterns, hits in ((self.success, self.success_hits),
                               (self.failure, self.failure_hits)):
            for pattern in patterns:
                if pattern.pattern not in hits and pattern.search(line):
                    hits[pattern.pattern] = PatternHit(pattern.pattern, self.lines, line)
        if self.oom is None and _OOM.search(line):
            self.oom = PatternHit("out of memory", self.lines, line)
        summary = parse_pytest_summary(line)
        if summary is not None:
            self.pytest = summary
        self._feed_performance(line)
        if self._block is None:
            acc = parse_accuracy(line)
            if acc is not None:
                self.accuracy.append(acc)

    def _feed_performance(self, line: str) -> None:
        message = strip_prefix(line)
        if _PERF_HEADER in message and message.lstrip("= ").startswith(_PERF_HEADER):
            self._close_block()
            self._block = {}
            return
        if self._block is None or not message or message.startswith("--"):
            return  # blank lines and "-- Request Latency Breakdown (ms) ---" section titles
        if _RULE.match(message):
            if self._block:
                self._close_block()
            return  # the rule under the header, or the next section's rule
        match = _PERF_METRIC.match(message)
        if match:
            name = " ".join(match.group("name").split())
            value = float(match.group("value"))
            if math.isfinite(value):
                self._block[name] = value
            return
        self._close_block()  # anything else: the block is over

    def _close_block(self) -> None:
        if self._block:
            self.performance = self._block
            self.performance_blocks += 1
        self._block = None

    def metrics(self) -> dict[str, float]:
        """Named numbers for checks and junit properties."""
        out: dict[str, float] = {}
        if self.pytest is not None:
            out.update({k: float(v) for k, v in self.pytest.counts.items()})
        for acc in self.accuracy:
            out[f"{acc.task} accuracy"] = acc.value
        if self.accuracy:
            out["accuracy"] = self.accuracy[-1].value
        out.update(self.performance)
        return out

    def summary(self) -> dict[str, Any]:
        """The summary of the workflow (seed: output parsing by workflow type)."""
        if self.workflow == "pytest":
            if self.pytest is None:
                return {"pytest": None, "last_lines": list(self.tail)[-CUSTOM_LINES:]}
            return {"pytest": {"line": self.pytest.line, "counts": self.pytest.counts,
                               "seconds": self.pytest.seconds}}
        if self.workflow == "eval":
            return {"accuracy": [{"task": a.task, "value": a.value, "samples": a.samples,
                                  "line": a.line} for a in self.accuracy]}
        if self.workflow == "bench":
            return {"performance": dict(self.performance),
                    "performance_blocks": self.performance_blocks}
        return {"last_lines": list(self.tail)[-CUSTOM_LINES:]}


def scan_log(
    read: Callable[[int, int], bytes],
    *,
    workflow: str,
    success_patterns: Iterable[str] = (),
    failure_patterns: Iterable[str] = (),
    start: int = 0,
    chunk: int = CHUNK,
) -> LogScan:
    """One pass over a log through ``read(offset, limit)``; lines are split on \\n and \\r."""
    scan = LogScan(workflow=workflow,
                   success=compile_patterns(success_patterns, "success pattern"),
                   failure=compile_patterns(failure_patterns, "failure pattern"))
    offset, rest = start, b""
    while True:
        data = read(offset, chunk)
        if not data:
            break
        offset += len(data)
        pieces = (rest + data).split(b"\n")
        rest = pieces.pop()
        if len(rest) > 4 * MAX_LINE:  # no newline for a long time: keep the end only
            rest = rest[-4 * MAX_LINE:]
        for piece in pieces:
            _feed_piece(scan, piece)
    if rest:
        _feed_piece(scan, rest)
    scan._close_block()
    return scan


def _feed_piece(scan: LogScan, piece: bytes) -> None:
    text = piece.decode("utf-8", "replace")
    parts = text.split("\r")  # progress bars rewrite the line: keep each state
    for part in parts:
        if part or len(parts) == 1:
            scan.feed(part)


_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "==": operator.eq,
    "!=": operator.ne}
_CHECK = re.compile(
    rf"^\s*(?P<name>.+?)\s*(?P<op>>=|<=|==|!=|>|<)\s*(?P<threshold>{_NUMBER})\s*"
    r"(?:\(\s*tolerance\s+(?P<tol>\d+(?:\.\d+)?)\s*%\s*\))?\s*$",
    re.IGNORECASE,
)
CHECK_SYNTAX = ("'<metric> <op> <number> [(tolerance N%)]' with op one of >=, >, <=, <, ==, !=; "
                "e.g. 'accuracy >= 79.0' or "
                "'Total Output Throughput (tokens/sec) >= 1000 (tolerance 5%)'")


@dataclass(frozen=True)
class MetricCheck:
    """``accuracy >= 79.0`` or ``Total Output Throughput (tokens/sec) >= 1000 (tolerance 5%)``;
    the tolerance relaxes the threshold in the check's favour (``>= 1000`` passes from 950)."""

    text: str
    metric: str
    op: str
    threshold: float
    tolerance_pct: float = 0.0

    @classmethod
    def parse(cls, text: str) -> MetricCheck:
        match = _CHECK.match(str(text))
        if not match:
            raise ConfigError(f"metric check {text!r}: expected {CHECK_SYNTAX}")
        return cls(text=str(text).strip(), metric=match.group("name").strip(),
                   op=match.group("op"), threshold=float(match.group("threshold")),
                   tolerance_pct=float(match.group("tol") or 0))

    @property
    def bound(self) -> float:
        """The threshold after the tolerance is applied."""
        margin = abs(self.threshold) * self.tolerance_pct / 100
        if self.op in (">=", ">"):
            return self.threshold - margin
        if self.op in ("<=", "<"):
            return self.threshold + margin
        return self.threshold

    def evaluate(self, metrics: dict[str, float]) -> CheckResult:
        name = self.metric if self.metric in metrics else next(
            (key for key in metrics if _norm(key) == _norm(self.metric)), None)
        if name is None:
            known = ", ".join(sorted(metrics)) or "none"
            return CheckResult(self, None, False,
                               f"{self.text}: metric {self.metric!r} not found in the log "
                               f"(metrics found: {known}), threshold {self.op} "
                               f"{self.threshold:.10g}")
        value = metrics[name]
        if self.op in ("==", "!="):
            margin = abs(self.threshold) * self.tolerance_pct / 100
            equal = abs(value - self.threshold) <= margin
            ok = equal if self.op == "==" else not equal
        else:
            ok = _OPS[self.op](value, self.bound)
        tol = f" (tolerance {self.tolerance_pct:g}%: bound {self.bound:.10g})" \
            if self.tolerance_pct else ""
        verdict = "passed" if ok else "FAILED"
        return CheckResult(self, value, ok,
                           f"{name} = {value:.10g}, threshold {self.op} {self.threshold:.10g}"
                           f"{tol}: {verdict}")


@dataclass(frozen=True)
class CheckResult:
    check: MetricCheck
    value: float | None
    ok: bool
    message: str


def _norm(name: str) -> str:
    return " ".join(name.lower().split())

