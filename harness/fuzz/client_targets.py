"""Client targets: a real client library facing a malicious reference server.

``harness fuzz --target client:p7`` runs the peer's own ``libggml-rpc`` (the ctypes agent,
:class:`~harness.impls.ctypes_driver.CtypesClientDriver`) through a realistic session against
the reference server with misbehaviour knobs (:mod:`harness.reference.knobs`) drawn by
hypothesis: the HELLO flags byte and ``conn_caps`` (the shared flag mutations), the announced
version, and response lengths (HELLO's, or any command's answer one byte longer), a close
instead of an answer, a cache hit claimed without data.

The 7.0.0 client aborts its process on anything it does not accept (spec 1.5, 2.3), so
outcomes are classified:

* **defence** (expected): exit 134 / SIGABRT with the library's own messages -- "version
  mismatch", "malformed response", "handshake failed";
* **refused**: the library returned an error without dying;
* **hang**: no answer within the step deadline -- expected when the server announced more
  bytes than it sent (the protocol has no timeouts, spec 1.1), a finding otherwise;
* **finding**: any other death -- SIGSEGV, SIGBUS, an assertion inside the library.

Each finding is replayed once more under a recording proxy so it is saved with a transcript
and pcap, like server findings; ``harness replay <dir>/finding.json --target client:p7``
runs it again.
"""

from __future__ import annotations

import io
import json
import random
import signal as _signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hypothesis import HealthCheck, Phase, Verbosity, given, seed as hyp_seed, settings
from hypothesis import strategies as st

from ..capture.pcap import write_pcap
from ..capture.proxy import RecordingProxy
from ..impls.driver import ClientAborted, StepFailed
from ..impls.ctypes_driver import ClientHung, CtypesClientDriver
from ..impls.registry import PeerError, get_peer
from ..reference.knobs import Misbehaviour
from ..reference.server import ReferenceServer
from ..reference.server_core import ServerConfig
from ..proto import CONN_CAPS_SIZE, DEFAULT, get_dialect
from ..proto.wire import RESPONSE_HEADER_SIZE
from .. import strategies as rst
from .signature import Signature, normalise, reproduces, signal_text
from .errors import TargetError

DEFENCES = ("version mismatch", "malformed response", "handshake failed")
# Commands of the scenario below whose answers can be garbled / refused.
ANSWERED = ("HELLO", "DEVICE_COUNT", "GET_ALIGNMENT", "GET_MAX_SIZE", "GET_DEVICE_MEMORY",
            "ALLOC_BUFFER", "BUFFER_GET_BASE", "GET_TENSOR", "COPY_TENSOR", "GET_ALLOC_SIZE")
KNOB_KINDS = ("hello_flags", "server_conn_caps", "hello_version", "hello_response_size",
              "garble_response_len", "close_on", "claim_cache_hit")
# The Misbehaviour field each kind sets (the coverage table counts these).
KNOB_FIELDS = ("hello_flags", "hello_caps", "hello_version", "hello_response_size",
               "garble_response_len", "close_on", "claim_cache_hit")


def scenario(endpoint: str) -> list[dict]:
    """A small but complete client session (buffers, upload, compute, download, copy...)."""
    return [
        {"op": "connect", "endpoint": endpoint},
        {"op": "device_count"}, {"op": "buffer_type"}, {"op": "device_memory"},
        {"op": "alloc_buffer", "name": "w", "size": 4096, "usage": "weights"},
        {"op": "alloc_buffer", "name": "c", "size": 4096, "usage": "compute"},
        {"op": "tensor", "name": "a", "buffer": "w", "offset": 0, "ne": [64]},
        {"op": "tensor", "name": "b", "buffer": "w", "offset": 256, "ne": [64]},
        {"op": "set", "tensor": "a", "fill": {"pattern": "arange"}},
        {"op": "set", "tensor": "b", "fill": {"pattern": "random", "seed": 1}},
        {"op": "get", "tensor": "a"},
        {"op": "node", "name": "s", "kind": "add", "inputs": ["a", "b"], "buffer": "c",
         "offset": 0},
        {"op": "compute", "outputs": ["s"]},
        {"op": "get", "tensor": "s"},
        {"op": "tensor", "name": "e", "buffer": "c", "offset": 512, "ne": [64]},
        {"op": "copy", "src": "a", "dst": "e"},
        {"op": "memset", "tensor": "e", "offset": 0, "size": 16, "value": 0},
        {"op": "clear", "buffer": "c", "value": 0},
        {"op": "free_buffer", "buffer": "c"},
        {"op": "close"},
    ]


@st.composite
def knob_sets(draw, dialect: str = DEFAULT.name) -> dict:
    """One or two misbehaviours of the server, as ``Misbehaviour`` fields (JSON-safe)."""
    d = get_dialect(dialect)
    out: dict = {}
    for kind in draw(st.lists(st.sampled_from(KNOB_KINDS), min_size=1, max_size=2,
                              unique=True)):
        if kind == "hello_flags":
            mut = draw(rst.flag_mutations(d, what="hello_flags"))
            out["hello_flags"] = mut.description["value"]
        elif kind == "server_conn_caps":
            mut = draw(rst.flag_mutations(d, what="server_conn_caps"))
            caps = RESPONSE_HEADER_SIZE + 4  # the answer: len, then version and flags, then caps
            out["hello_caps"] = mut.data[caps:caps + CONN_CAPS_SIZE].hex()
        elif kind == "hello_version":
            major, minor, patch = d.version
            out["hello_version"] = list(draw(st.sampled_from((
                (major, minor, patch + 1), (major, minor + 1, 0), (major + 1, 0, 0),
                (major - 1, 0, 0), (0, 0, 0), (255, 255, 255)))))
        elif kind == "hello_response_size":
            out["hello_response_size"] = draw(st.sampled_from((0, 3, 27, 29, 1 << 20)))
        elif kind == "garble_response_len":
            out["garble_response_len"] = draw(st.sampled_from(ANSWERED[1:]))
        elif kind == "close_on":
            out["close_on"] = draw(st.sampled_from(ANSWERED))
        elif kind == "claim_cache_hit":
            out["claim_cache_hit"] = True
    return out


@dataclass
class ClientOutcome:
    category: str  # ok | defence | refused | hang | finding
    step: str  # op of the step where it ended ("" when the session completed)
    message: str = ""
    signature: Signature | None = None
    log_tail: list[str] = field(default_factory=list)


def run_client_case(lib_dir: Path, proto: str, dialect: str, knobs: dict, *,
                    step_timeout: float = 10.0, record: bool = False,
                    ) -> tuple[ClientOutcome, list]:
    """One session of the real client against a reference server with ``knobs``."""
    config = ServerConfig(dialect=get_dialect(dialect), memory_budget=64 << 20,
                          knobs=Misbehaviour.from_dict(knobs))
    server = ReferenceServer(config, idle_timeout=step_timeout, out=io.StringIO(),
                             err=io.StringIO())
    host, port = server.start()
    proxy = RecordingProxy((host, port), idle_timeout=step_timeout * 4).start() if record \
        else None
    endpoint = f"{host}:{(proxy.port if proxy else port)}"
    driver = CtypesClientDriver(lib_dir, proto=proto, step_timeout=step_timeout,
                                session_timeout=step_timeout * 6)
    steps = scenario(endpoint)
    outcome = ClientOutcome("ok", "")
    try:
        for s in steps:
            try:
                driver.run(s)
            except StepFailed as e:
                outcome = ClientOutcome("refused", s["op"], e.result.error)
                break
            except ClientHung as e:
                outcome = _hang(knobs, s["op"], e)
                break
            except ClientAborted as e:
                outcome = _classify(s["op"], e)
                break
    finally:
        driver.close()
        transcripts = proxy.stop() if proxy else []
        server.stop()
    return outcome, transcripts


def _hang(knobs: dict, op: str, e: ClientHung) -> ClientOutcome:
    # A HELLO announcing more bytes than it carries leaves the client waiting by design.
    size = knobs.get("hello_response_size")
    if size is not None and size > 28:
        return ClientOutcome("hang", op, "waits for the announced bytes (no timeouts, spec 1.1)")
    sig = Signature("hang", "", "client made no progress", op)
    return ClientOutcome("finding", op, e.exit_info.message, sig, e.exit_info.log_tail)


def _classify(op: str, e: ClientAborted) -> ClientOutcome:
    info = e.exit_info
    text = info.message + "\n" + "\n".join(info.log_tail)
    if info.aborted and info.signal == _signal.SIGABRT and any(x in text for x in DEFENCES):
        kind = next(x for x in DEFENCES if x in text)
        return ClientOutcome("defence", op, kind, None, info.log_tail)
    sig = Signature("crash", signal_text(info), normalise(info.message), op)
    return ClientOutcome("finding", op, info.message, sig, info.log_tail)


# ---------------------------------------------------------------- campaign

@dataclass
class ClientCampaignConfig:
    peer: str = "p7"
    duration: float = 120.0
    seed: int | None = None
    out: Path | None = None
    step_timeout: float = 10.0
    round_examples: int = 50


def _peer_client(name: str) -> tuple[Path, str, str]:
    try:
        peer = get_peer(name)
    except PeerError as e:
        raise TargetError(str(e)) from None
    if not peer.available or peer.lib_dir is None:
        raise TargetError(f"peer {name} has no client library here: {peer.reason}")
    proto = peer.proto or peer.verified_proto or DEFAULT.name
    return Path(peer.lib_dir), proto, get_dialect(proto).name


def run_client_campaign(cfg: ClientCampaignConfig, *,
                        on_progress: Callable | None = None) -> tuple[Path, dict]:
    from .campaign import Progress, campaign_id
    from .report import write_report

    lib_dir, proto, dialect = _peer_client(cfg.peer)
    out = Path(cfg.out) if cfg.out else Path("reports") / f"fuzz-{campaign_id('client-' + cfg.peer)}"
    (out / "crashes").mkdir(parents=True, exist_ok=True)
    seed = cfg.seed if cfg.seed is not None else random.SystemRandom().randrange(1 << 31)
    end = time.time() + cfg.duration
    progress = Progress()
    stats: dict = {"cases": 0, "frames": 0, "restarts": 0}
    outcomes: dict = {}
    knob_coverage: dict = {}
    seen: set = set()

    def emit() -> None:
        progress.handle({"type": "stats", "worker": 0, "stats": dict(stats),
                         "statuses": dict(outcomes), "dialect": dialect})
        if on_progress is not None:
            on_progress(progress)

    round_no = 0
    while time.time() < end:
        @settings(database=None, max_examples=cfg.round_examples, deadline=None,
                  phases=(Phase.generate,), suppress_health_check=list(HealthCheck),
                  verbosity=Verbosity.quiet, print_blob=False)
        @hyp_seed(seed * 1_000_003 + round_no)
        @given(knob_sets(dialect))
        def client_case(knobs):
            if time.time() >= end:
                return
            outcome, _ = run_client_case(lib_dir, proto, dialect, knobs,
                                         step_timeout=cfg.step_timeout)
            stats["cases"] += 1
            stats["restarts"] += 1  # every case starts a fresh client process
            key = outcome.category + (f": {outcome.message}" if outcome.category == "defence"
                                      else "")
            outcomes[key] = outcomes.get(key, 0) + 1
            for k in knobs:
                knob_coverage[k] = knob_coverage.get(k, 0) + 1
            if outcome.category == "finding" and outcome.signature not in seen:
                seen.add(outcome.signature)
                progress.findings.append(_save_client_finding(out, cfg, lib_dir, proto, dialect,
                                                              knobs, outcome, end))
            emit()
        client_case()
        round_no += 1
    report = _client_report(cfg, seed, progress, outcomes, knob_coverage, dialect)
    write_report(out, report)
    return out, report


def _save_client_finding(out: Path, cfg: ClientCampaignConfig, lib_dir: Path, proto: str,
                         dialect: str, knobs: dict, outcome: ClientOutcome, end: float) -> dict:
    sig = outcome.signature
    folder = out / "crashes" / sig.id
    folder.mkdir(parents=True, exist_ok=True)
    again, transcripts = run_client_case(lib_dir, proto, dialect, knobs,
                                         step_timeout=cfg.step_timeout, record=True)
    if transcripts:
        transcripts[0].meta["fuzz"] = {"knobs": knobs}
        transcripts[0].save(folder / "repro.rpct")
        write_pcap(transcripts, folder / "repro.pcap")
    finding = {
        "format": "ggml-rpc-fuzz-client-finding/1", "id": sig.id, "signature": sig.to_json(),
        "title": sig.title(), "target": f"client:{cfg.peer}", "dialect": dialect,
        "knobs": knobs, "detail": outcome.message, "log_tail": outcome.log_tail[-20:],
        "steps": len(scenario("x")), "listing": [f"server knobs: {json.dumps(knobs)}"]
        + [f"{i:3d} {s['op']}" for i, s in enumerate(scenario("<endpoint>"))],
        "replay": f"harness replay {folder}/finding.json --target client:{cfg.peer}",
        "replays": again.signature == sig, "confirmed": again.signature == sig,
    }
    (folder / "finding.json").write_text(json.dumps(finding, indent=1) + "\n")
    return finding


@dataclass
class ClientReplayResult:
    expected: Signature | None
    observed: ClientOutcome

    @property
    def reproduced(self) -> bool:
        o = self.observed
        # the one replay rule; the step a client died at is not part of its signature
        return o.category == "finding" and reproduces(self.expected, o.signature, command=False)

    def summary(self) -> str:
        o = self.observed
        return "\n".join([
            f"expected : {self.expected.title() if self.expected else '(none saved)'}",
            f"observed : {o.category} at {o.step or 'end'}: {o.message}"
            + (f" [{o.signature.title()}]" if o.signature else ""),
            "REPRODUCED" if self.reproduced else "not reproduced"])


def replay_client_finding(path: str | Path, peer: str,
                          step_timeout: float = 10.0) -> ClientReplayResult:
    path = Path(path)
    if path.is_dir():
        path = path / "finding.json"
    data = json.loads(path.read_text())
    lib_dir, proto, dialect = _peer_client(peer)
    outcome, _ = run_client_case(lib_dir, proto, data.get("dialect", dialect), data["knobs"],
                                 step_timeout=step_timeout)
    expected = Signature.from_json(data["signature"]) if data.get("signature") else None
    return ClientReplayResult(expected, outcome)


def _client_report(cfg: ClientCampaignConfig, seed: int, progress, outcomes: dict,
                   knob_coverage: dict, dialect: str) -> dict:
    elapsed = max(progress.elapsed, 1e-9)
    cases = progress.total("cases")
    return {
        "format": "ggml-rpc-fuzz-report/1", "target": f"client:{cfg.peer}",
        "target_kind": "client", "dialect": dialect, "seed": seed, "workers": 1,
        "duration_s": cfg.duration, "elapsed_s": round(elapsed, 1), "interrupted": False,
        # Server-campaign figures that have no meaning here are null, not zero.
        "messages_sent": None, "messages_per_s": None, "bytes_sent": None, "cases": cases,
        "cases_per_s": round(cases / elapsed, 2), "restarts": cases, "shrink_attempts": 0,
        "verdicts": len(progress.findings), "duplicates": 0, "unconfirmed": 0,
        "statuses": outcomes, "rss_peak_bytes": None, "rss_limit_bytes": None,
        "deadline_s": cfg.step_timeout, "as_limit_bytes": None, "findings": progress.findings,
        "distinct_signatures": len(progress.findings),
        "coverage": {"mutations_exercised": len(knob_coverage),
                     "mutations_catalogue": len(KNOB_FIELDS),
                     "by_kind": {"knob": {"exercised": len(knob_coverage),
                                          "catalogue": len(KNOB_FIELDS)}},
                     "missing": [k for k in KNOB_FIELDS if k not in knob_coverage],
                     "command_field": {"server knobs": knob_coverage}, "valid_commands": {},
                     "mutated_messages": cases, "valid_messages": 0},
        "errors": [], "config": {k: str(v) for k, v in cfg.__dict__.items()},
        "nothing_found": not progress.findings,
    }
