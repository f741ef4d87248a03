"""The scenario API: what a scenario is, what it gets to work with, what it hands back.

Both sides depend on this module and on nothing of each other: every module of the top-level
``scenarios`` package defines a class decorated with :func:`scenario`, which registers it in
:data:`SCENARIOS`; the matrix imports the package and finds scenarios in the registry.

A scenario drives clients through a cell (a client implementation facing a server
implementation through a recording proxy) and judges what happened from the decoded
transcripts: the outcome is computed from the bytes both sides sent, not from what the
programs say about themselves. Data checks compare what came back with the expected bytes.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from .errors import HarnessError
from .impls.driver import ClientAborted, ClientDriver, ExitInfo, StepFailed, fingerprint, make_fill
from .proto import Cmd, Session
from .strictness import (BUILD_ERROR, DEVICE_MISSING, NOT_APPLICABLE, PEER_MISSING,
                         PROGRAM_MISSING)

if TYPE_CHECKING:  # pragma: no cover
    from .capture.transcript import Transcript
    from .reference.client import RefClient
    from .reference.knobs import Misbehaviour

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


# Why a cell did not run (the codes live in harness/strictness.py with every other skip
# code). Only NOT_APPLICABLE is a property of the cell itself; the others mean something this
# machine lacks, and a run fails on them unless it names them in --allow-skip (a skip must
# never pass for evidence). BUILD_ERROR (something the cell needs failed to compile) no
# --allow-skip accepts: a build error is a failure.
SKIP_CODES = (NOT_APPLICABLE, PEER_MISSING, PROGRAM_MISSING, DEVICE_MISSING, BUILD_ERROR)


@dataclass(frozen=True)
class Skip:
    reason: str
    code: str = NOT_APPLICABLE
    missing: str | None = None  # what is missing: a peer name, "p7:llama-simple", a transport

    def __post_init__(self):
        if self.code not in SKIP_CODES:
            raise ValueError(f"unknown skip code {self.code!r}; known: {', '.join(SKIP_CODES)}")


class ServerHandle(Protocol):
    name: str
    dialect: str
    cache_dir: Any

    def poll(self) -> ExitInfo | None: ...

    def log_tail(self, n: int = 20) -> list[str]: ...


class Context(Protocol):
    """What the matrix gives a scenario."""

    endpoint: str  # host:port of the recording proxy in front of the server
    cache: bool  # the server runs with a cache directory
    client_dialect: str
    server_dialect: str
    client_kind: str  # "ref" | "pin" | "user" | "docker"
    server_kind: str
    server: ServerHandle
    workdir: Any

    def new_client(self) -> ClientDriver: ...

    def ref_client(self, *, knobs: "Misbehaviour | None" = None,
                   dialect: str | None = None) -> "RefClient": ...

    def sessions(self) -> list[Session]: ...

    def transcripts(self) -> list["Transcript"]: ...

    def cache_files(self) -> list[str]: ...

    def log(self, message: str) -> None: ...

    def model_client_unavailable(self) -> Skip | None: ...

    # llama-simple once locally, then ``runs`` times over RPC to ``servers`` (default: the
    # cell's own); a mixed fleet adds the design's other server role (``other_server``)
    other_server: Any  # its adapter (kind, dialect, name), or None

    def run_model_client(self, *, runs: int = 1, servers: list | None = None) -> dict: ...

    def own_server(self) -> Any: ...

    def start_other_server(self) -> Any: ...

    def second_server_unavailable(self) -> Skip | None: ...

    def second_server(self) -> ServerHandle: ...  # with .port; on 127.0.0.1


class Scenario:
    """Base class: subclasses set the metadata, implement ``run`` and register with
    ``@scenario``."""

    id: ClassVar[str]
    title: ClassVar[str]
    description: ClassVar[str]
    checks: ClassVar[tuple[str, ...]] = ()
    # the wire facts a working verdict rests on (harness.matrix.evidence): commands the client
    # must have sent at least once ("A|B": either), and the connections it opens, each with
    # HELLO; a rejection rests on the HELLO alone
    evidence: ClassVar[tuple[str, ...]]
    evidence_connections: ClassVar[int] = 1
    # which server option values this scenario is worth running under
    cache_options: ClassVar[tuple[bool, ...]] = (False,)
    # every connection uploads a weights tensor above the hash threshold, so whether the
    # client hashes tells its dialect's hashing policy (checked against the client's label)
    uploads_big_weights: ClassVar[bool] = False

    def applicable(self, ctx: Context) -> Skip | None:
        """None if the scenario can run in this cell, else why it is skipped."""
        return None

    def run(self, ctx: Context) -> Observation:  # pragma: no cover - abstract
        raise NotImplementedError


SCENARIOS: dict[str, Scenario] = {}
S = TypeVar("S", bound=type[Scenario])


def scenario(cls: S) -> S:
    """Class decorator: register one instance of ``cls`` under ``cls.id``."""
    for attr in ("id", "title", "description"):
        if not isinstance(getattr(cls, attr, None), str):
            raise TypeError(f"scenario {cls.__name__} needs a string {attr!r}")
    evidence = getattr(cls, "evidence", None)
    if not isinstance(evidence, tuple) or not evidence or not all(
            name in Cmd.__members__ for entry in evidence for name in entry.split("|")):
        raise TypeError(f"scenario {cls.__name__} needs `evidence`: a non-empty tuple of the "
                        "commands its verdict rests on (Cmd names; 'A|B' for either)")
    if cls.id in SCENARIOS and type(SCENARIOS[cls.id]) is not cls:
        raise ValueError(f"scenario id {cls.id!r} is taken by {type(SCENARIOS[cls.id]).__name__}")
    SCENARIOS[cls.id] = cls()
    return cls


# ---------------------------------------------------------------- running steps

class Ended(HarnessError):
    """The client ended or refused a step; ``observation`` says what that means."""

    def __init__(self, observation: Observation):
        self.observation = observation


def run_steps(ctx: Context, steps: list[dict], *, connect: bool = True) -> list[dict]:
    """Run ``steps`` (after connect) on a new client; results in order (connect excluded)."""
    client = ctx.new_client()
    try:
        if connect:
            client.do("connect", endpoint=ctx.endpoint)
        out = [client.run(s).result for s in steps]
        client.do("close")
        return out
    except ClientAborted as e:
        client.close()
        raise Ended(judge_abort(ctx, e, ctx.sessions())) from None
    except StepFailed as e:
        raise Ended(Observation(FAILED, message=e.result.error,
                                signature=f"step-refused: {e.result.op}: {e.result.error}")) from None
    finally:
        client.close()


# ---------------------------------------------------------------- shared judgement helpers

def data_check(name: str, got: dict, fill: dict, nbytes: int) -> Check:
    """A ``get`` step's fingerprint against the bytes ``fill`` describes."""
    want = _fill_fingerprint(make_fill, json.dumps(fill, sort_keys=True), nbytes)
    return expect_fingerprint(name, got, dict(want))


@functools.lru_cache(maxsize=64)
def _fill_fingerprint(fill_fn, fill_json: str, nbytes: int) -> tuple:
    # make_fill is deterministic in (fill, nbytes): every cell of a run checks the same 64 MiB
    # fills, each check drew and hashed them again (a second for roundtrip on a loaded machine).
    # Keyed by the function too: a test that plants a wrong make_fill gets its own answers.
    return tuple(fingerprint(fill_fn(json.loads(fill_json), nbytes)).items())


def expect_bytes(name: str, got: dict, want) -> Check:
    """A ``get`` step's fingerprint against the expected bytes ``want``."""
    return expect_fingerprint(name, got, fingerprint(want))


def expect_fingerprint(name: str, got: dict, want: dict) -> Check:
    """A ``get`` step's fingerprint against the fingerprint of the expected bytes."""
    ok = got.get("fnv") == want["fnv"] and got.get("size") == want["size"]
    return Check(name, ok, "" if ok else
                 f"got {got.get('size')} bytes fnv {got.get('fnv')} head {got.get('head', '')[:32]}, "
                 f"want {want['size']} bytes fnv {want['fnv']} head {want['head'][:32]}")


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
    if first is not None and first.server_hello is not None and "version mismatch" in msg:
        # The client says it refused the server's HELLO: the wire must agree.
        after = facts["commands_after_hello"]
        return Observation(REJECTED, rejected_by="client", message=msg, facts=facts, checks=[
            Check("client sent nothing after the HELLO it rejected", after == 0,
                  f"{after} commands after HELLO"),
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
