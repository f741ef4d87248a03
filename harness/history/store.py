"""The history store: one JSON object per line, appended to, never rewritten.

A line is one fact of one run: a matrix cell's verdict, a matrix run's totals (its size on
disk, the builds it ran), a fuzz campaign's findings and coverage, a bench figure, a bisect
answer, a test suite run's time by area. `harness matrix`, `fuzz`, `bench` and `bisect` append what they produced;
`harness history add` files older report folders; `harness site` reads it all.

Every line names its schema (``SCHEMA``). A reader refuses a line of a newer major version
(it cannot know what the line means) and a line that does not validate, with the file and
line number: a history is evidence, and a silently dropped line would change a verdict strip.
Records are keyed (``Record.key``), so filing the same run twice adds nothing.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Annotated, Iterable, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from .errors import HistoryError

SCHEMA = "ggml-rpc-history/1"
SCHEMA_NAME, SCHEMA_MAJOR = SCHEMA.rsplit("/", 1)
HISTORY_ENV = "GGML_RPC_HARNESS_HISTORY"  # where the commands append (a path; "off": nowhere)
HISTORY_NAME = "history.jsonl"
MAX_LINE = 1 << 20  # a record is a summary: a longer line is a corrupt store, not a record


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    schema_: str = Field(SCHEMA, alias="schema")
    run_id: str
    time: float  # seconds since the epoch: when the run ended


class CellRecord(_Record):
    kind: Literal["cell"] = "cell"
    cell_id: str
    design: str
    scenario: str
    pair: str
    client: str
    server: str
    client_dialect: str | None = None
    server_dialect: str | None = None
    cache: bool = False
    transport: str = "tcp"
    verdict: str
    observed: str | None = None
    expected: str | None = None
    reason: str | None = None
    folder: str | None = None  # the cell's folder, relative to its run folder

    @property
    def key(self) -> tuple:
        return ("cell", self.run_id, self.cell_id)


class BuildFacts(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    name: str
    kind: str | None = None
    dialect: str | None = None
    digest: str | None = None  # the RPC source digest's short form (equivalence class)


class RunRecord(_Record):
    kind: Literal["run"] = "run"
    title: str = ""
    cells: int = 0
    counts: dict[str, int] = {}  # verdict -> cells
    size_bytes: int | None = None  # the run folder on disk
    files: int | None = None
    builds: list[BuildFacts] = []
    folder: str | None = None  # the run folder as filed (for the site's links)

    @property
    def key(self) -> tuple:
        return ("run", self.run_id)


class CampaignRecord(_Record):
    kind: Literal["campaign"] = "campaign"
    target: str
    engine: str = "live"
    dialect: str | None = None
    seconds: float | None = None
    messages: int | None = None
    findings: dict[str, int] = {}  # finding class (signature kind) -> distinct findings
    replayed: int | None = None  # findings that `harness replay` reproduced
    rate: float | None = None  # messages (libFuzzer: executions) per second
    cases: int | None = None  # connections (libFuzzer: executions)
    restarts: int | None = None
    workers: int | None = None
    seed: int | None = None
    coverage: dict[str, float | int | None] = {}
    problems: list[str] = []
    folder: str | None = None

    @property
    def key(self) -> tuple:
        return ("campaign", self.run_id)


class BenchRecord(_Record):
    kind: Literal["bench"] = "bench"
    figure: str
    title: str = ""
    unit: str = ""
    value: float | None = None
    ratio: float | None = None
    met: bool | None = None
    failed: str | None = None
    folder: str | None = None

    @property
    def key(self) -> tuple:
        return ("bench", self.run_id, self.figure)


class BisectRecord(_Record):
    kind: Literal["bisect"] = "bisect"
    package: str
    good: str
    bad: str
    question: str = ""
    first_different: str | None = None
    last_same: str | None = None
    measured: int | None = None
    folder: str | None = None

    @property
    def key(self) -> tuple:
        return ("bisect", self.run_id)


class SuiteRecord(_Record):
    """One run of the test suite (``pytest --suite-profile``): its wall time and where the
    time went, so the suite's growth shows run over run."""
    kind: Literal["suite"] = "suite"
    wall: float
    workers: int = 0
    tests: int = 0
    outcomes: dict[str, int] = {}
    test_seconds: float = 0.0  # the tests' own seconds summed (more than wall under xdist)
    areas: dict[str, float] = {}  # area -> seconds
    slowest: list[tuple[str, float]] = []  # (test, seconds), the slowest first
    host: dict[str, str | int | float | list[float] | None] = {}
    folder: str | None = None

    @property
    def key(self) -> tuple:
        return ("suite", self.run_id)


Record = Annotated[Union[CellRecord, RunRecord, CampaignRecord, BenchRecord, BisectRecord,
                         SuiteRecord], Field(discriminator="kind")]
_RECORD = TypeAdapter(Record)


def parse_line(line: str, where: str = "history") -> _Record:
    """One line of a store as its record; HistoryError says which line and why not."""
    if len(line) > MAX_LINE:
        raise HistoryError(f"{where}: a line of {len(line):,} characters (bound {MAX_LINE:,})")
    try:
        raw = json.loads(line)
    except ValueError as e:
        raise HistoryError(f"{where}: not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise HistoryError(f"{where}: not an object")
    name, _, major = str(raw.get("schema", "")).rpartition("/")
    if name != SCHEMA_NAME or not major.isdigit():
        raise HistoryError(f"{where}: schema {raw.get('schema')!r} is not {SCHEMA_NAME}/N")
    if int(major) > int(SCHEMA_MAJOR):
        raise HistoryError(f"{where}: schema {raw['schema']} is newer than this harness reads "
                           f"({SCHEMA}): update the harness")
    try:
        return _RECORD.validate_python(raw)
    except ValidationError as e:
        first = e.errors()[0]
        loc = first["loc"][1:] if first["loc"][:1] == (raw.get("kind"),) else first["loc"]
        at = ".".join(str(p) for p in loc)
        raise HistoryError(f"{where}: {raw.get('kind')!r} record: {at}: {first['msg']}") \
            from None


def read(path: Path) -> list[_Record]:
    """Every record of the store at ``path`` (none when it does not exist)."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                out.append(parse_line(line, f"{path}:{n}"))
    return out


def append(path: Path, records: Iterable[_Record]) -> int:
    """Append the records the store does not hold yet; returns how many were written.
    The file is locked while it is read and extended, so two runs ending together (fuzz
    workers, CI shards on one disk) neither lose nor double a line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    with os.fdopen(fd, "r+", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        held = {parse_line(line, f"{path}:{n}").key
                for n, line in enumerate(f, 1) if line.strip()}
        new = []
        for r in records:
            if r.key not in held:
                held.add(r.key)
                new.append(r.model_dump_json(by_alias=True, exclude_none=True) + "\n")
        f.seek(0, os.SEEK_END)
        f.write("".join(new))
        f.flush()
        os.fsync(f.fileno())
    return len(new)


def store_for(out_root: Path) -> Path | None:
    """Where a command whose reports go under ``out_root`` appends: $GGML_RPC_HARNESS_HISTORY
    when set ("off": nowhere), else ``out_root/history.jsonl``."""
    env = os.environ.get(HISTORY_ENV)
    if env:
        return None if env == "off" else Path(env)
    return Path(out_root) / HISTORY_NAME
