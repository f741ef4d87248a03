"""Triage of an in-process campaign: every distinct failure (the events the target
records, libFuzzer's artifacts) becomes one finding with a signature from its report;
an input is re-run without the cap or with the stack trace where its first report is
provisional (``running.rerun``, one module attribute: tests replace it)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ...proto import get_dialect
from .. import sanitizer
from ..signature import Signature, death_line, reproduces
from . import corpus as lfc
from . import running
from .config import CAPPED_LINE, MAX_RERUNS, NO_RSS_THREAD


_TRACE = re.compile(r"^harness-fuzz: command (?P<cmd>\d+) at byte (?P<at>\d+)")


_EVENT_HEAD = re.compile(r"^(?P<key>kind|command|offset|length|capped): (?P<value>.*)$")


@dataclass
class Failure:
    signature: Signature
    data: bytes
    detail: str
    source: str  # "abort event" | "sanitizer event" | artifact name
    report: str = ""


def _command_name(dialect: str, data: bytes, cmd_id: int | None, offset: int | None) -> str:
    """The request that was running: by the byte offset of its command in the input."""
    d = get_dialect(dialect)
    if offset is not None:
        pos = 0
        for frame in lfc.split_frames(data):
            if pos == offset:
                cmd = d.ids.get(frame[0])
                return cmd.value if cmd is not None else f"UNKNOWN_{frame[0]}"
            pos += len(frame)
    if cmd_id is not None and cmd_id >= 0:
        cmd = d.ids.get(cmd_id)
        return cmd.value if cmd is not None else f"UNKNOWN_{cmd_id}"
    return "NONE"


def signature_of(text: str, dialect: str, data: bytes, cmd_id: int | None = None,
                 offset: int | None = None) -> tuple[Signature, str] | None:
    """The finding signature of a target's log (None: nothing broke in it)."""
    lines = text.splitlines()
    if cmd_id is None:
        traced = [m for m in map(_TRACE.match, lines) if m]
        if traced:
            cmd_id, offset = int(traced[-1].group("cmd")), int(traced[-1].group("at"))
    command = _command_name(dialect, data, cmd_id, offset)
    report = sanitizer.parse(lines)
    if report is not None and not report.is_abort:
        signal = "" if report.kind in ("memory", "hang") else "exit 1"
        return Signature(report.kind, signal, report.signature_line(), command), report.text
    line = death_line(lines)  # the same line a live campaign reads from the server's log
    if line:
        return Signature("crash", "SIGABRT", line, command), death_line(lines, raw=True)
    return None


def _read_event(path: Path) -> tuple[dict, str]:
    head: dict = {}
    text = path.read_text(errors="replace")
    body_at = text.find("\n\n")
    for line in text[:body_at].splitlines():
        m = _EVENT_HEAD.match(line)
        if m:
            head[m.group("key")] = m.group("value")
    return head, text[body_at + 2:]


@dataclass
class Triage:
    found: dict  # Signature -> Failure (the smallest input of each)
    seen: Counter  # how often each signature was met
    not_rerun: int  # artifacts and event groups left without a re-run (beyond MAX_RERUNS)
    unconfirmed: int = 0  # event groups whose input did not fail again when re-run alone


def _needs_rerun(head: dict) -> bool:
    """An event the campaign's run cannot name alone: a UBSan report line (recorded without its
    stack trace) or anything that happened after the cap refused an allocation (what the input
    does without the cap is what a live server does)."""
    return head.get("kind") == "ubsan" or int(head.get("capped", 0) or 0) > 0


def triage(binary: Path, events: Path, artifacts: Path, dialect: str, env: dict,
           deadline: float) -> Triage:
    """Distinct failures (smallest input per signature), how often each was seen, and what was
    left without a re-run. ``env`` is the one without the campaign's allocation cap and with
    UBSan's stack trace: every re-run names its finding as a live sanitizer server would."""
    found: dict[Signature, Failure] = {}
    seen: Counter = Counter()
    explained: set[str] = set()

    def add(sig: Signature, data: bytes, detail: str, source: str, report: str,
            times: int = 1) -> None:
        seen[sig] += times
        old = found.get(sig)
        if old is None or len(data) < len(old.data):
            found[sig] = Failure(sig, data, detail, source, report)

    groups: dict[Signature, list[tuple[bytes, str]]] = {}  # provisional signature -> inputs
    for ev in sorted(events.glob("*.event")):
        inp = ev.with_suffix(".input")
        if not inp.exists():
            continue
        head, body = _read_event(ev)
        data = inp.read_bytes()
        explained.add(lfc.input_name(data))
        got = signature_of(body, dialect, data, int(head.get("command", -1)),
                           _frame_start(data, int(head.get("offset", 0))))
        if got is None and head.get("kind") == "capped":
            command = _command_name(dialect, data, int(head.get("command", -1)), None)
            got = Signature("memory", "", CAPPED_LINE, command), body
        if got is None:
            continue
        if _needs_rerun(head):
            groups.setdefault(got[0], []).append((data, head.get("kind", "?")))
        else:
            add(got[0], data, got[1], f"{head.get('kind', '?')} event", body)
    # One re-run per provisional signature (its smallest input): many jobs die of the same
    # few UBSan reports, and one line names them all.
    ordered = sorted(groups.items(), key=lambda kv: min(len(d) for d, _ in kv[1]))
    unconfirmed = 0
    with tempfile.TemporaryDirectory(prefix="harness-triage-") as tmp:
        for _, members in ordered[:MAX_RERUNS]:
            data, kind = min(members, key=lambda m: len(m[0]))
            path = Path(tmp) / "input"
            path.write_bytes(data)
            log = running.rerun(binary, path, env, deadline)
            got = signature_of(log, dialect, data) if log is not None else None
            if got is None:
                unconfirmed += 1  # it needed the cap (or the job's state) to fail
                continue
            add(got[0], data, got[1], f"{kind} event, re-run", log, times=len(members))
    pending = sorted((p for p in artifacts.iterdir() if p.is_file()
                      and p.name.split("-", 1)[-1] not in explained),
                     key=lambda p: p.stat().st_size)
    for art in pending[:MAX_RERUNS]:
        data = art.read_bytes()
        log = running.rerun(binary, art, env, deadline)
        got = signature_of(log, dialect, data) if log is not None else None
        if got is None:
            continue  # did not fail alone (state of the job that found it, or timing)
        add(got[0], data, got[1], art.name, log)
    return Triage(found, seen, max(0, len(pending) - MAX_RERUNS) +
                  max(0, len(ordered) - MAX_RERUNS), unconfirmed)


def _frame_start(data: bytes, offset: int) -> int | None:
    """The start of the frame the server read last, given its read position ``offset`` (the
    byte after the last one read)."""
    last = max(offset - 1, 0)
    pos = 0
    for frame in lfc.split_frames(data):
        if pos <= last < pos + len(frame):
            return pos
        pos += len(frame)
    return None


def minimise(binary: Path, failure: "Failure", dialect: str, env: dict, work: Path,
             seconds: float, deadline: float) -> tuple[bytes, bool]:
    """libFuzzer's crash minimiser on the failure's input (aborting like the server), kept
    only if the smaller input still fails with the same signature. (input, minimised)."""
    work.mkdir(parents=True, exist_ok=True)
    src, dst = work / "input", work / "minimal"
    src.write_bytes(failure.data)
    dst.unlink(missing_ok=True)
    # Only the finding's own abort ends the process; for a sanitizer finding, none does.
    own = failure.signature.line.removesuffix(": ...") \
        if failure.signature.signal == "SIGABRT" else "\x01no abort"
    run_env = dict(env, HARNESS_FUZZ_ABORT="1", HARNESS_FUZZ_ABORT_ONLY=own)
    run_env.pop("HARNESS_FUZZ_EVENTS", None)
    # The minimiser runs rounds of -max_total_time each (child processes of its own): a
    # quarter of the budget per round, the whole group ended when the budget is spent; the
    # smallest input so far is in ``dst`` either way.
    proc = subprocess.Popen([str(binary), "-minimize_crash=1", NO_RSS_THREAD,
                             f"-max_total_time={max(int(seconds / 4), 1)}",
                             f"-timeout={max(int(deadline), 1)}", f"-exact_artifact_path={dst}",
                             str(src)], env=run_env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if not dst.is_file() or len(dst.read_bytes()) >= len(failure.data):
        return failure.data, False
    data = dst.read_bytes()
    log = running.rerun(binary, dst, env, deadline)
    got = signature_of(log, dialect, data) if log is not None else None
    if got is None or not reproduces(failure.signature, got[0], command=False):
        return failure.data, False
    failure.signature = got[0]  # the command of the minimal input (like a lockstep run)
    return data, True
