"""Finding signatures: what identifies a bug (class, signal, the normalised line that says why,
the command), read from a dead target's log (:func:`death_line`: an assert, an uncaught
exception, a sanitizer report or the fault shim's faulting module and symbol), and the
rules two signatures are compared by (an abort that moved a few lines, a macro spanning
lines). Used by every engine, the replay and the reports; no process is launched here.
"""

from __future__ import annotations

import hashlib
import re
import signal
from dataclasses import asdict, dataclass
from pathlib import Path

from ..impls.driver import ExitInfo
from . import sanitizer
from .faultinfo import LINE_PREFIX


@dataclass(frozen=True)
class Signature:
    """What identifies a finding: two findings with equal signatures are the same bug."""

    kind: str  # crash | hang | memory | protocol | one of harness.fuzz.oracles.KINDS
    signal: str  # "SIGABRT", "SIGSEGV", "exit 1", or "" when the process lives on
    line: str  # first meaningful log line (crash) or what was observed, normalised
    command: str  # the command of the step that caused it

    @property
    def id(self) -> str:
        """Short stable name (folder names, report anchors)."""
        h = hashlib.sha1("\x1f".join((self.kind, self.signal, bug_line(self.line),
                                      self.command)).encode()).hexdigest()[:8]
        return f"{self.kind}-{slug(self.command)}-{h}"

    def same_bug(self, other: "Signature | None", *, command: bool = True) -> bool:
        if other is None:
            return False
        same = (self.kind, self.signal, bug_line(self.line)) == \
            (other.kind, other.signal, bug_line(other.line))
        return same and (not command or self.command == other.command)

    def title(self) -> str:
        parts = [self.kind]
        if self.signal:
            parts.append(self.signal)
        parts.append(f"in {self.command}")
        return " ".join(parts) + (f": {self.line}" if self.line else "")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Signature":
        return cls(d["kind"], d.get("signal", ""), d.get("line", ""), d.get("command", ""))


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").lower()[:24] or "none"


# Log lines that say why a process died, most telling first.
# glibc's fatal messages (written to stderr under REAL_PROCESS_ENV): a heap its allocator finds
# corrupted, a smashed stack canary, a _FORTIFY_SOURCE overflow
GLIBC_FATAL = re.compile(
    r"^(?:double free or corruption \(\S+\)|free\(\): double free detected in tcache \d+"
    r"|(?:free|malloc|realloc|calloc|munmap_chunk|malloc_consolidate|_int_malloc|_int_free"
    r"|tcache_thread_shutdown)\(\): [^\n]+|corrupted (?:size vs\. prev_size|double-linked list"
    r"|top size)[^\n]*|\*\*\* (?:stack smashing|buffer overflow) detected \*\*\*[^\n]*)$")
_DEATH_PATTERNS = [re.compile(p) for p in (
    r"(?:\S+\.(?:c|cpp|h):\d+: )?GGML_ASSERT\(.*\) failed",
    r"GGML_ABORT.*|\S+\.(?:c|cpp|h):\d+: .*",
    r"terminate called .*",
    r"Assertion .* failed.*",
    GLIBC_FATAL.pattern,
    r"AddressSanitizer: .*|UndefinedBehaviorSanitizer: .*|runtime error: .*",
    r"(Segmentation fault|Aborted|Bus error).*",
)]
_PY_EXC = re.compile(r"^(\w+(?:\.\w+)*(?:Error|Exception|Exit|Interrupt)\b.*)$")
_PY_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+, in (\S+)')
# An absolute path, or a relative one starting with ./ or ../ (a build through ccache with a
# base directory names its sources relative to the build directory): the file name stays.
_PATH = re.compile(r"(?:(?<![^\s(:'\"=])\.{1,2}(?:/[^\s:()'\"]+)*|(?:/[^\s:()'\"]+)+)"
                   r"/([^\s/:()'\"]+)")
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_BIG_NUMBER = re.compile(r"\b\d{5,}\b")


def without_paths(text: str) -> str:
    """``text`` with every directory part of a path dropped (no machine paths in reports)."""
    return _PATH.sub(r"\1", text)


def normalise(line: str) -> str:
    """A log line without run-specific noise: paths cut to the file name, addresses and big
    numbers (sizes, pids) replaced, so the same bug gives the same line on every run."""
    line = _PATH.sub(r"\1", line.strip())
    line = _HEX.sub("0x?", line)
    line = _BIG_NUMBER.sub("N", line)
    return line[:300]


def death_line(log_lines: list[str], *, raw: bool = False) -> str:
    """The most meaningful line of a dead server's log (normalised unless ``raw``), or ""."""
    norm = (lambda x: x.strip()) if raw else normalise
    # A Python traceback: the exception and the innermost frame of ours say it all.
    for i in range(len(log_lines) - 1, -1, -1):
        m = _PY_EXC.match(log_lines[i].strip())
        if m and any("Traceback" in x for x in log_lines[max(0, i - 200):i]):
            where = ""
            for j in range(i - 1, max(0, i - 200) - 1, -1):
                f = _PY_FRAME.match(log_lines[j])
                if f:
                    where = f" at {Path(f.group(1)).name}:{f.group(2)}"
                    break
            return norm(m.group(1)[:200] + where)
    report = sanitizer.parse(log_lines)  # ASan/UBSan builds: the report names the bug
    if report is not None and not report.is_abort and report.tool != "libFuzzer":
        return norm(report.summary or report.text.splitlines()[0]) if raw \
            else report.signature_line()
    for line in log_lines:
        if line.startswith(LINE_PREFIX):
            text = _PATH.sub(r"\1", line[len(LINE_PREFIX):].strip())[:300]
            return text if raw else _fault_site(text)
    for pat in _DEATH_PATTERNS:
        for line in log_lines:
            m = pat.search(line)
            if m:
                return norm(m.group(0)) if raw else _abort_site(norm(m.group(0)))
    return ""


_SITE_AT = (r"(?P<{0}mod>\S+)\+0x(?P<{0}off>[0-9a-f]+)"
            r"(?: \((?P<{0}sym>[^+)]+)\+0x[0-9a-f]+\))?")
_FAULT = re.compile(r"^(?P<head>.* in )" + _SITE_AT.format("") +
                    r"(?: from " + _SITE_AT.format("from_") + ")?$")
_ABORT_AT = re.compile(r"^(\S+\.(?:c|cc|cpp|h|hpp|cu|m|mm):\d+: )(.*)$")


def _fault_site(text: str) -> str:
    """The fault shim's line reduced to where it happened: the function when the module
    exports one there, else the 4 KiB page of the module (one function, nearly always), so
    two faults at neighbouring instructions of one function are one bug. A stack overflow
    keeps its class only."""
    if " stack overflow in " in text:
        # Where the stack ran out depends on its random start (ASLR), not on the bug: the
        # class alone is the signature, whatever the rest of the line holds.
        return text.split(" in ", 1)[0]
    m = _FAULT.match(text)
    if m is None:
        return text
    site = m.group("head") + _site(m, "")
    return site + (f" from {_site(m, 'from_')}" if m.group("from_mod") else "")


def _site(m: re.Match, prefix: str) -> str:
    mod, sym = m.group(f"{prefix}mod"), m.group(f"{prefix}sym")
    if sym:
        return f"{mod} ({sym})"
    return f"{mod} page 0x{int(m.group(f'{prefix}off'), 16) & ~0xFFF:x}"


def _abort_site(text: str) -> str:
    """An abort at ``file:line: message``: the location names the bug; a formatted message
    (``binary_op: unsupported types: dst: q4_0, ...``) keeps only its first part, so each
    type combination is not a bug of its own. GGML_ASSERT conditions are static: kept."""
    m = _ABORT_AT.match(text)
    if m is None or m.group(2).startswith("GGML_ASSERT"):
        return text
    first, sep, _ = m.group(2).partition(": ")
    return m.group(1) + first + (": ..." if sep else "")


# gcc gives ``__LINE__`` of a macro call that spans lines as its first line, clang as its last
# (a GGML_ABORT with its arguments on the next lines): the same abort is lines apart between
# a gcc-built release server and the clang-built in-process target or sanitizer server.
MACRO_CALL_LINES = 4
_SITE = re.compile(r"^(?P<file>\S+\.(?:c|cc|cpp|h|hpp|cu|m|mm)):(?P<line>\d+): (?P<msg>.*)$")


def same_abort_site(a: str, b: str) -> bool:
    """Do two abort lines (``file:line: message``) name one abort, as two compilers place it?
    The same file and message, lines at most MACRO_CALL_LINES - 1 apart."""
    ma, mb = _SITE.match(a), _SITE.match(b)
    return bool(ma and mb and ma["file"] == mb["file"] and ma["msg"] == mb["msg"]
                and abs(int(ma["line"]) - int(mb["line"])) < MACRO_CALL_LINES)


# The fault shim's class of a faulting address (harness/fuzz/faultinfo.py). Below 64 KiB is
# "null page", elsewhere "wild address": for a pointer the code read from memory (ggml_op_name
# indexing its name table with an op past the enum), which one depends on what lies there,
# which the address layout of the process decides. One site, two classes, one bug.
_BAD_POINTER = re.compile(r"^(?P<sig>SIG\w+) (?:null page|wild address) in (?P<site>.+)$")


def bug_line(line: str) -> str:
    """The line as it identifies a bug: a null-page and a wild-address dereference at one
    faulting site (module and symbol) are one line, so a campaign claims them once and a
    replay of one reproduces the other. Other classes (stack overflow, arithmetic) stay."""
    m = _BAD_POINTER.match(line)
    return f"{m['sig']} bad pointer in {m['site']}" if m else line


def same_abort_moved(a: str, b: str) -> bool:
    """Do two abort lines name one abort in two builds of the code, wherever it sits? The same
    file and message at any line: between builds unrelated edits move an assert (a 7.0.0
    GGML_ASSERT was at ggml-rpc.cpp:1401 in b10985, :1413 in b11327, :1429 in b11413)."""
    ma, mb = _SITE.match(a), _SITE.match(b)
    return bool(ma and mb and ma["file"] == mb["file"] and ma["msg"] == mb["msg"])


def reproduces(expected: Signature | None, observed: Signature | None, *,
               across_builds: bool = False, command: bool = True) -> bool:
    """The one replay rule (TCP, RDMA, client and in-process replays, minimisation): did a run
    that ended with ``observed`` reproduce the finding saved as ``expected``? The same class,
    the same abort line / sanitizer report / faulting frame (an abort moved to another line
    only ``across_builds``), and the same command (unless ``command`` is False: engines whose
    signature names the request that happened to be running). A reproducer without a saved
    signature reproduces nothing: any failure would do, which is no evidence that it is this
    one; neither does a death without a log line where the saved one has a line."""
    o, e = observed, expected
    if o is None or e is None or o.kind != e.kind:
        return False
    if o.kind == "memory" and sanitizer.rss_bound(o.line) and sanitizer.rss_bound(e.line):
        # one RSS bound passed, whichever sampler saw it first: which step it noticed it
        # at is timing, so the command is no part of this bug's signature
        return True
    if command and o.command != e.command:
        return False
    if o.same_bug(e, command=command):
        return True
    if o.signal == e.signal and (same_abort_site(o.line, e.line) or (
            across_builds and same_abort_moved(o.line, e.line))):
        return True  # one abort, its __LINE__ as gcc and as clang place it (or moved)
    if o.signal == e.signal and e.line and o.line.startswith(e.line + " from "):
        return True  # saved by a shim that did not yet name the caller of a libc fault
    if sanitizer.same_bad_access(o.line, e.line):
        return True  # one bad read or write; where the address landed is the heap's layout
    if sanitizer.same_report(o.line, e.line):
        # One sanitizer error seen by two builds: how it ends the process is a runtime
        # option (exit 1 in process, SIGABRT from a server with abort_on_error).
        return True
    # Two deaths without a log line (saved and replayed without the fault shim, see
    # faultinfo): the signal and the command are all there is to compare. One with a
    # line and one without is not shown to be the same bug.
    return not o.line and not e.line and o.signal == e.signal


_VM_HWM = re.compile(r"^VmHWM:\s+(\d+) kB", re.M)


def vm_hwm(pid: int) -> int | None:
    """The kernel's high-water mark of a process's RSS in bytes (None: not readable)."""
    try:
        m = _VM_HWM.search(Path(f"/proc/{pid}/status").read_text())
    except OSError:
        return None
    return int(m.group(1)) << 10 if m else None


def signal_text(info: ExitInfo) -> str:
    if info.signal:
        try:
            return signal.Signals(info.signal).name
        except ValueError:
            return f"signal {info.signal}"
    if info.returncode is not None and info.returncode > 128:
        try:
            return signal.Signals(info.returncode - 128).name
        except ValueError:
            pass
    return f"exit {info.returncode}"
