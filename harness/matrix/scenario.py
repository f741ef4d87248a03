"""What a scenario is, what it gets to work with, and what it hands back.

A scenario drives clients through a cell (a client implementation facing a server
implementation through a recording proxy) and then judges what happened from the decoded
transcripts: the outcome is computed from the bytes both sides sent, not from what the
programs say about themselves.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol

from ..impls.driver import ClientAborted, ClientDriver, ExitInfo
from ..proto import Cmd, Session

if TYPE_CHECKING:  # pragma: no cover
    from ..capture.transcript import Transcript
    from ..peer.client import RefClient

WORKS = "works"
DEGRADED = "works-degraded"
REJECTED = "rejected-at-hello"
FAILED = "failed"
OUTCOMES = (WORKS, DEGRADED, REJECTED, FAILED)


@dataclass
class Check:
    name: str
    ok: bool
    evidence: str = ""


@dataclass
class Observation:
    outcome: str
    degraded: list[str] = field(default_factory=list)
    rejected_by: str | None = None  # "client" | "server"
    message: str = ""
    signature: str | None = None  # a stable description of a failure
    checks: list[Check] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)  # numbers for reports and profiles
    misconfigured: str | None = None  # the wire contradicts the cell's label

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def failed_checks(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]


class ServerHandle(Protocol):
    name: str
    dialect: str
    cache_dir: Any

    def poll(self) -> ExitInfo | None: ...

    def log_tail(self, n: int = 20) -> list[str]: ...


class Context(Protocol):
    """What the runner gives a scenario."""

    endpoint: str  # host:port of the recording proxy in front of the server
    cache: bool  # the server runs with a cache directory
    client_dialect: str
    server_dialect: str
    client_kind: str  # "ref" | "pin" | "user" | "docker"
    server: ServerHandle
    workdir: Any

    def new_client(self) -> ClientDriver: ...

    def ref_client(self, *, knobs=None, dialect: str | None = None) -> "RefClient": ...

    def sessions(self) -> list[Session]: ...

    def transcripts(self) -> list["Transcript"]: ...

    def cache_files(self) -> list[str]: ...

    def log(self, message: str) -> None: ...


class Scenario:
    """Base class: subclasses set the metadata and implement ``run``."""

    id: ClassVar[str]
    title: ClassVar[str]
    description: ClassVar[str]
    checks: ClassVar[tuple[str, ...]] = ()
    # which server option values this scenario is worth running under
    cache_options: ClassVar[tuple[bool, ...]] = (False,)
    requires: ClassVar[Callable[["Context"], str | None] | None] = None

    def applicable(self, ctx: Context) -> str | None:
        """None if the scenario can run in this cell, else the reason it is skipped."""
        return None

    def run(self, ctx: Context) -> Observation:  # pragma: no cover - abstract
        raise NotImplementedError


# ---------------------------------------------------------------- shared judgement helpers

def handshake_facts(session: Session) -> dict:
    """Facts about the opening of one decoded connection."""
    hello = session.server_hello
    after = [e for e in session.exchanges[1:] if e.request is not None]
    return {
        "server_version": "%d.%d.%d" % hello.version if hello else None,
        "server_flags": hello.flags if hello else None,
        "commands_after_hello": len(after),
        "client_closed": session.c2s_closed,
        "server_closed": session.s2c_closed,
        "c2s_error": session.c2s_error,
        "s2c_error": session.s2c_error,
    }


def judge_abort(ctx: Context, err: ClientAborted, sessions: list[Session]) -> Observation:
    """A client ended early: decide from the wire whether that was a HELLO rejection."""
    info = err.exit_info
    first = sessions[0] if sessions else None
    facts = handshake_facts(first) if first else {}
    msg = info.message or ""
    at_hello = first is not None and first.server_hello is not None and \
        facts.get("commands_after_hello") == 0
    if at_hello and "version mismatch" in msg:
        return Observation(REJECTED, rejected_by="client", message=msg, facts=facts, checks=[
            Check("client sent nothing after the HELLO it rejected",
                  facts["commands_after_hello"] == 0,
                  f"{facts['commands_after_hello']} commands after HELLO"),
            Check("rejection names the server's version",
                  facts["server_version"] is not None and facts["server_version"] in msg,
                  msg)])
    hello_sent = first is not None and (first.commands[:1] == [Cmd.HELLO] or
                                        "command=HELLO" in (first.c2s_error or ""))
    if hello_sent and first.server_hello is None:
        # the server hung up instead of answering HELLO (possibly before reading all of it)
        return Observation(REJECTED, rejected_by="server",
                           message=msg or "server closed the connection at HELLO", facts=facts)
    sig = f"client-{'abort' if info.aborted else 'exit'}: {msg or info.returncode}"
    if info.signal and not info.aborted:
        sig = f"client-crash: signal {info.signal}"
    return Observation(FAILED, message=msg, signature=sig, facts=facts)


def count(sessions: list[Session], cmd: Cmd) -> int:
    return sum(s.count(cmd) for s in sessions)


def label_check(ctx: Context, sessions: list[Session]) -> str | None:
    """The cell's label must match what the server announced on the wire."""
    from ..proto import get_dialect
    expected = get_dialect(ctx.server_dialect)
    for s in sessions:
        h = s.server_hello
        if h is None:
            continue
        if h.version != expected.version:
            return (f"server labelled {expected.name} announced "
                    f"{'%d.%d.%d' % h.version} on the wire")
        if h.flags and not expected.server_flags:
            return f"server labelled {expected.name} sent flags 0x{h.flags:02x} in HELLO byte 3"
    return None
