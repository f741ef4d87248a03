"""Root causes: the findings of a campaign grouped by where the target failed, ranked by
severity in ClusterFuzz's terms.

Seven commands reaching one range assert are one bug with seven ways in, not seven bugs. A
finding's *site* is what names the failure independently of the request that led there: the
abort's ``file:line: message``, the sanitizer class with its faulting frame, the fault shim's
module and function (with its caller for a fault inside libc), the exception that ended a
Python server. Findings without a site (a hang, a memory bound, an oracle) keep their command:
nothing shows that two commands hang for one reason.

Severity, worst first (ClusterFuzz's order, as the project asks for it): a write out of
bounds (an accepted one too: harness.fuzz.bounds), a read out of bounds (a SIGSEGV at a wild
address is at least that), a use after free
or a null dereference, a memory or liveness denial of service (memory bound, hang, the
resource oracles, a stack overflow), other undefined behaviour, a reachable assert or abort,
a protocol violation or a compatibility finding (a plain in-bounds request refused).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from . import sanitizer
from .bounds import ACCEPTED_OOB, REFUSED_IN_BOUNDS
from .signature import GLIBC_FATAL

SEVERITIES = ("write out of bounds", "read out of bounds", "use after free / null dereference",
              "memory or liveness DoS", "undefined behaviour", "reachable assert",
              "protocol violation")
_OVERFLOW = re.compile(r"(heap|stack|global|dynamic-stack|container)-buffer-overflow|"
                       r"stack-use-after-(return|scope)|\bunknown-crash\b|negative-size-param")
_UAF = re.compile(r"use-after-free|double-free|attempting free|bad-free|alloc-dealloc-mismatch"
                  r"|null pointer|zero page|\bnull\b", re.I)
_DOS_KINDS = {"hang", "memory", "amplification", "freeze", "fd-leak", "spin"}
_MUTATION = re.compile(r"<- (\S+) (\S+)")


def severity(kind: str, signal: str, line: str) -> int:
    """The rank (0 is worst) of a finding's signature in :data:`SEVERITIES`."""
    if kind == ACCEPTED_OOB:  # harness.fuzz.bounds: the line starts with the access
        return 0 if line.startswith("write") else 1
    if GLIBC_FATAL.match(line):  # an allocator or canary that found its memory overwritten
        return 2 if "double free" in line else 0
    if kind in _DOS_KINDS or "stack overflow" in line or "out-of-memory" in line:
        return 3
    if kind in ("protocol", "cache", REFUSED_IN_BOUNDS):
        return 6
    if sanitizer.report_key(line) is not None:
        head = line.split(" in ", 1)[0]
        if "UndefinedBehaviorSanitizer" in head or "runtime error" in head:
            return 2 if _UAF.search(head) else 4
        if _UAF.search(head):
            return 2
        if _OVERFLOW.search(head) or "SEGV" in head:
            return 0 if "WRITE" in head else 1
        return 4  # memcpy-param-overlap, leaks, ...
    if signal in ("SIGSEGV", "SIGBUS"):
        if " null page" in line:
            return 2
        return 1  # a wild address: at least a read out of bounds
    if signal in ("SIGFPE", "SIGILL"):
        return 4
    return 5


def site(kind: str, signal: str, line: str, command: str) -> str:
    """What names the failure: the signature line for a death with a line, else the kind,
    signal and command."""
    if kind == "crash" and line:
        return line
    return " ".join(x for x in (kind, signal, line, f"in {command}") if x)


@dataclass
class RootCause:
    site: str
    severity: int
    findings: list[dict] = field(default_factory=list)

    @property
    def label(self) -> str:
        return SEVERITIES[self.severity]

    @property
    def commands(self) -> list[str]:
        return sorted({f["signature"]["command"] for f in self.findings})

    @property
    def variants(self) -> list[str]:
        """The mutations that lead there (``kind:what field``), one per finding's last
        mutated step."""
        out: list[str] = []
        for f in self.findings:
            marks = [m for line in f.get("listing", []) for m in _MUTATION.findall(line)]
            if marks:
                v = f"{marks[-1][0]} {marks[-1][1]}"
                if v not in out:
                    out.append(v)
        return out

    @property
    def smallest(self) -> dict:
        return min(self.findings, key=lambda f: (f.get("steps", 0), f.get("bytes", 0), f["id"]))

    def to_json(self) -> dict:
        return {"site": self.site, "severity": self.label, "rank": self.severity,
                "findings": [f["id"] for f in self.findings], "commands": self.commands,
                "variants": self.variants, "smallest": self.smallest["id"]}


def root_causes(findings: list[dict]) -> list[RootCause]:
    """The findings grouped by site, worst severity first, then the most findings."""
    groups: dict[str, RootCause] = {}
    for f in findings:
        s = f["signature"]
        key = site(s["kind"], s.get("signal", ""), s.get("line", ""), s.get("command", ""))
        rc = groups.setdefault(key, RootCause(key, severity(s["kind"], s.get("signal", ""),
                                                           s.get("line", ""))))
        rc.findings.append(f)
    return sorted(groups.values(), key=lambda r: (r.severity, -len(r.findings), r.site))


def root_cause_lines(findings: list[dict], md=lambda s: s) -> list[str]:
    """The report's first table: one row per root cause."""
    causes = root_causes(findings)
    if not causes:
        return []
    lines = ["## Root causes", "",
             f"{len(causes)} root cause(s) of {len(findings)} finding(s), worst first "
             "(severity: " + " > ".join(SEVERITIES) + "); the findings below are the "
             "variants.", "",
             "| # | severity | where it fails | commands | reached by | smallest reproducer |",
             "|---|---|---|---|---|---|"]
    for i, rc in enumerate(causes, 1):
        small = rc.smallest
        lines.append(f"| {i} | {rc.label} | `{md(rc.site)}` | {', '.join(rc.commands)} | "
                     f"{md(', '.join(rc.variants) or '-')} | [{small['id']}](#{small['id']}) "
                     f"({small.get('steps', '?')} steps) |")
    return lines + [""]
