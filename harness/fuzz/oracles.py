"""Oracles beyond death: what a server that stays alive may still do wrong with one connection.

Five finding kinds, each with a threshold (``harness fuzz`` options, :class:`OracleLimits`):

* **amplification** -- resident memory of the target grew by more than ``amplification`` x
  what the connection could justify (request bytes sent plus the ALLOC_BUFFER sizes it asked
  for) and by more than ``amplification_floor``, at its peak during the case (the kernel's
  high-water mark, restarted with each case), so memory given back before any sample counts;
* **freeze** -- while one connection is held open mid-frame (a partial header or payload, then
  silence), a HELLO on a fresh connection goes unanswered for ``freeze_wait`` seconds. Only for
  servers that serve connections concurrently: the real 7.0.0 server serves one connection at
  a time by design (spec 1.1), so for it (and the serial reference server) every held
  connection blocks everyone and that is not a finding. Whether the target serves a second
  client while a first one sits idle between frames is probed once; a serial target gets one
  note in the report ("serves one connection at a time") instead of findings;
* **cache** -- with ``cache`` (the target runs with ``-c``): the cache directory gained more
  files than the connection sent uploads with ``cache_flag`` set, or more bytes than those
  uploads carried (dialects without the flag: every upload counts);
* **fd-leak** -- open descriptors of the target grew across connections: in a campaign, by
  ``fd_growth`` over the lowest count since the process started; a reproducer in isolation
  (confirmation, minimisation, replay) leaves the count higher than before once its
  connection and the health probe's are closed;
* **spin** -- the target used more than ``spin_seconds`` of CPU time on one connection and
  still serves; named after the request whose answer took longest.

In a campaign (:meth:`Oracles.judge_stream`) the samples are cheap (one read of the
process's counters per case) and only trigger: the runner confirms a trigger by running the
case again in isolation (:meth:`Oracles.judge_isolated`), where the baseline is taken just
before the case and the after-sample once the server has answered a fresh HELLO. A one-off
growth (a lazily loaded library) does not come back on the second run and is dropped.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import psutil

from ..proto import (DEFAULT, Cmd, ConnectionClosed, Data, EndOfMessage, NEED_DATA, Request,
                     RequestHead, RequestReader, get_dialect)
from ..proto.codec import pack_request
from ..proto.messages import GetAlignmentRequest
from ..transport.tcp import recv_exact
from .case import Case, step
from .execute import CLOSED, OK, Outcome
from .target import Target
from .signature import Signature

AMPLIFICATION, FREEZE, CACHE, FD_LEAK, SPIN = "amplification", "freeze", "cache", "fd-leak", \
    "spin"
KINDS = (AMPLIFICATION, FREEZE, CACHE, FD_LEAK, SPIN)
FD_SETTLE = 0.5  # seconds a server may take to close a finished connection's descriptor
RSS_SETTLE = 0.3  # seconds to let memory settle after the last (unanswered) request
SERIAL_NOTE = ("serves one connection at a time (spec 1.1: the real server's design): a "
               "connection held mid-frame blocks every other client, so the freeze oracle "
               "does not apply")


@dataclass
class OracleLimits:
    """Thresholds of the oracles; 0 switches one off."""

    amplification: float = 16.0  # growth > this x (bytes sent + buffer sizes asked for)
    amplification_floor: int = 128 << 20  # ... and > this many bytes
    freeze_wait: float = 1.0  # seconds a probe HELLO may wait while a connection is mid-frame
    cache: bool = False  # run the target with its hash cache (-c) and watch the directory
    fd_growth: int = 16  # open descriptors above the lowest count since the target started
    spin_seconds: float = 2.0  # CPU seconds one connection may cost

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict | None) -> "OracleLimits":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (d or {}).items() if k in known})


@dataclass
class CaseCost:
    """What a connection's requests can justify (decoded as the server reads them)."""

    bytes: int = 0
    alloc: int = 0  # ALLOC_BUFFER sizes asked for
    # distinct SET_TENSOR payloads the cache may file (cache_flag set), and their bytes: the
    # cache is content-addressed, so a hundred identical uploads justify one file (counting
    # uploads let them hide files written for uploads that never asked)
    uploads: int = 0
    upload_bytes: int = 0
    payloads: dict = field(default_factory=dict)  # digest -> size of each counted payload

    def add(self, other: "CaseCost") -> None:
        self.bytes += other.bytes
        self.alloc += other.alloc
        for digest, size in other.payloads.items():
            self.upload(digest, size)

    def upload(self, digest: bytes, size: int) -> None:
        if digest not in self.payloads:
            self.payloads[digest] = size
            self.uploads += 1
            self.upload_bytes += size


def case_cost(case: Case, sent: int | None = None) -> CaseCost:
    """The cost of the first ``sent`` steps of ``case`` (all by default)."""
    d = get_dialect(case.dialect)
    reader = _reader(case.dialect)
    cost = CaseCost()
    flagged = None  # the hash of the flagged upload being read, and its announced size
    for s in case.steps[:sent]:
        cost.bytes += len(s.frame)
        reader.feed(s.frame)
        try:
            while True:
                ev = reader.next_event()
                if ev is NEED_DATA or isinstance(ev, ConnectionClosed):
                    break
                msg = getattr(ev, "message", None)
                if isinstance(ev, Request) and msg.cmd is Cmd.ALLOC_BUFFER:
                    cost.alloc += msg.size
                elif isinstance(ev, RequestHead):
                    flagged = (hashlib.sha1(), ev.data_length) if msg.cmd is Cmd.SET_TENSOR \
                        and (not d.cache_flag or msg.cache_flag) else None
                elif isinstance(ev, Data) and flagged is not None:
                    flagged[0].update(ev.data)
                elif isinstance(ev, EndOfMessage) and flagged is not None:
                    # only a whole payload can be filed (a cut one is dropped by the server)
                    cost.upload(flagged[0].digest(), flagged[1])
                    flagged = None
        except Exception:  # noqa: BLE001 - the server refuses here: nothing more counts
            break
    return cost


def open_frame_step(case: Case) -> int | None:
    """The step whose frame the server is still reading at the end of ``case``."""
    reader = _reader(case.dialect)
    start = None
    for i, s in enumerate(case.steps):
        was = reader.in_frame
        reader.feed(s.frame)
        ended = False
        try:
            while True:
                ev = reader.next_event()
                if ev is NEED_DATA or isinstance(ev, ConnectionClosed):
                    break
                ended = ended or isinstance(ev, (Request, EndOfMessage))
        except Exception:  # noqa: BLE001 - refused: the server closes, no frame stays open
            return None
        if reader.in_frame and (ended or not was):
            start = i
    return start if reader.in_frame else None


def _reader(dialect: str) -> RequestReader:
    # Decode whatever length is announced (nothing is buffered beyond it), as annotate does.
    return RequestReader(get_dialect(dialect), max_payload=1 << 62, max_stream=1 << 62,
                         stream=frozenset({Cmd.SET_TENSOR, Cmd.SET_TENSOR_2D}))


ANY_FRAME = "any frame"  # the command of a freeze that every held frame causes
HOLD_EVERY = 8  # against a concurrent target, one case in this many is also run held open


def held_variant(case: Case, rng) -> Case | None:
    """``case`` up to one of its steps, cut inside that step's frame (a partial header or
    payload), the connection then held open: what the freeze oracle probes against."""
    candidates = [i for i, s in enumerate(case.steps) if len(s.frame) > 1]
    if not candidates:
        return None
    i = rng.choice(candidates)
    s = case.steps[i]
    cut = rng.choice((rng.randrange(1, min(len(s.frame), 9)),  # inside the header
                      rng.randrange(1, len(s.frame))))
    held = step(s.frame[:cut], s.cmd, desc={"kind": "framing", "what": "held-open",
                                             "cmd": s.cmd, "field": "frame", "value": cut})
    out = case.with_steps(case.steps[:i] + (held,))
    return out if out.open_ended and out.protocol_error_at is None else None


@dataclass
class Snapshot:
    pid: int | None
    starts: int
    rss: int | None = None
    fds: int | None = None
    cpu: float | None = None
    cache_files: int = 0
    cache_bytes: int = 0
    cache_entries: dict | None = None  # isolated runs: path -> (inode, mtime, size)


def cache_entries(folder: Path | None) -> dict[str, tuple[int, int, int]]:
    """Every file under ``folder``: path -> (inode, mtime_ns, size)."""
    out = {}
    if folder is None:
        return out
    for root, _, names in os.walk(folder):
        for n in names:
            path = os.path.join(root, n)
            try:
                st = os.stat(path)
            except OSError:
                continue  # a temporary file that was renamed meanwhile
            out[path] = (st.st_ino, st.st_mtime_ns, st.st_size)
    return out


def written(before: dict, after: dict) -> tuple[int, int]:
    """(files, bytes) written between two :func:`cache_entries`: new or rewritten files
    (content-named entries are rewritten in place, so a count alone misses a second write)."""
    changed = [v for k, v in after.items() if before.get(k) != v]
    return len(changed), sum(v[2] for v in changed)


def _caught_up(case: Case, out: Outcome) -> bool:
    """Is the server done with what the case asked? It is when it answered the case's last
    request (a connection is served in order) or closed the connection (it reads no more of
    it; a server that died has no RSS): its RSS then needs no time to settle (a 20 ms wait per
    isolated check was half of a campaign's minimising time)."""
    if out.status == CLOSED:
        return True
    return out.status == OK and out.progress == len(case.steps) and bool(case.steps[-1].expect)


class Oracles:
    """The oracles of one target (one worker, or one replay)."""

    def __init__(self, target: Target, limits: OracleLimits):
        self.target = target
        self.limits = limits
        # A container's process is the engine's, not the server: no process counters there.
        self.local = target.spec.kind != "docker"
        self.notes: dict[str, str] = {}
        self.concurrent: bool | None = None
        self.freezes_any = False  # a connection held after HELLO + one byte freezes everyone
        self.triggers = 0  # campaign samples that looked bad (confirmed or not)
        self._proc: psutil.Process | None = None
        self._rss_during: int | None = None
        self._frozen: str | None = None
        self._late_probe: socket.socket | None = None
        # Campaign windows (per target process)
        self._starts = -1
        self._window: Snapshot | None = None
        self._window_cost = CaseCost()
        self._fds_low: int | None = None
        self._first: Snapshot | None = None
        self._total_cost = CaseCost()
        if not self.local:
            self.notes["process"] = "a container target: memory, descriptor, CPU and cache " \
                                    "oracles need the server's own process and are off"

    # ---------------------------------------------------------------- samples
    def _process(self) -> psutil.Process | None:
        server = self.target.server
        if server is None or not self.local:
            return None
        if self._proc is None or self._proc.pid != server.pid:
            try:
                self._proc = psutil.Process(server.pid)
            except psutil.Error:
                self._proc = None
        return self._proc

    def before(self, case: Case, *, isolated: bool = False) -> Snapshot:
        """The baseline of a case, taken before it runs (and the concurrency probe, which
        must not meet our own held connection)."""
        if self.limits.freeze_wait and case.open_ended:
            self.is_concurrent()
        self._rss_during = None
        return self.snapshot(entries=isolated)

    def _peak_rss(self) -> int | None:
        """The server's peak RSS since the case began (the runner restarts the kernel's
        high-water mark with each case)."""
        return self.target.peak_rss() if self.local else None

    @property
    def holding(self) -> bool:
        """Should the campaign run held variants (a concurrent target whose freezes are not
        yet known to happen for every frame)?"""
        return bool(self.limits.freeze_wait and self.concurrent and not self.freezes_any)

    def snapshot(self, *, entries: bool = False) -> Snapshot:
        p = self._process()
        snap = Snapshot(p.pid if p else None, self.target.starts)
        if p is None:
            return snap
        try:
            with p.oneshot():
                snap.rss = p.memory_info().rss
                snap.fds = p.num_fds() if self.limits.fd_growth else None
                if self.limits.spin_seconds:
                    t = p.cpu_times()
                    snap.cpu = t.user + t.system
        except psutil.Error:
            pass
        if self.limits.cache:
            found = cache_entries(self.target.cache_dir())
            snap.cache_files, snap.cache_bytes = len(found), sum(v[2] for v in found.values())
            snap.cache_entries = found if entries else None
        return snap

    def _rss(self) -> int | None:
        p = self._process()
        try:
            return p.memory_info().rss if p is not None else None
        except psutil.Error:
            return None

    # ---------------------------------------------------------------- per connection
    def during(self, case: Case, out: Outcome, *, isolated: bool) -> None:
        """While the connection is still open (the executor's ``before_close``)."""
        self._frozen = None
        if self.limits.amplification and self.local:
            self._rss_during = self._settled_rss() if isolated and not _caught_up(case, out) \
                else self._rss()
        if (self.limits.freeze_wait and case.open_ended and out.status == OK
                and self.is_concurrent()):
            time.sleep(0.02)  # let the server read the partial frame before probing
            # Unanswered, the probe stays open until our connection is closed and the late
            # answer is read (see _answers_hello).
            answered, self._late_probe = _probe(self.target, self.limits.freeze_wait)
            if not answered:
                self._frozen = f"no HELLO answer on a second connection within " \
                               f"{self.limits.freeze_wait:g} s while this one was mid-frame"

    def _drain_probe(self) -> None:
        sock, self._late_probe = self._late_probe, None
        if sock is not None:
            try:
                sock.settimeout(max(self.limits.freeze_wait, 2.0))
                recv_exact(sock, 8)
            except OSError:
                pass
            _close(sock)

    def _settled_rss(self) -> int | None:
        """RSS once the server has caught up with requests that have no answer."""
        last = self._rss()
        end = time.monotonic() + RSS_SETTLE
        while last is not None and time.monotonic() < end:
            time.sleep(0.02)
            now = self._rss()
            if now is None or abs(now - last) < (1 << 20):
                return max(last, now or 0)
            last = now
        return last

    def is_concurrent(self) -> bool:
        """Does the target answer a second client while a first one sits between frames?
        Probed once per Oracles; a serial target is noted, not reported as findings."""
        if self.concurrent is None:
            self.concurrent = _serves_two(self.target, self.limits.freeze_wait)
            self.notes["freeze"] = ("serves connections concurrently: the freeze oracle "
                                    "applies" if self.concurrent else SERIAL_NOTE)
        return self.concurrent

    def judge_isolated(self, case: Case, out: Outcome, before: Snapshot):
        """The verdict (signature, detail) of a case run on its own, after the server proved
        it still serves (a HELLO on a new connection); None when every oracle is content."""
        self._drain_probe()
        if before.pid is None and self.local:
            return None
        after = self.snapshot(entries=True)
        if after.pid != before.pid:
            return None  # restarted meanwhile: nothing to compare
        cost = case_cost(case, _sent(case, out))
        # amplification before spin: zeroing a payload size the client announced costs CPU
        # too (p7 spent 2.3 s of CPU on 512 MiB on a loaded CI machine), and the memory is
        # the cause, the CPU its symptom
        found = self._freeze(case) or self._amplification(case, out, before.rss, cost) or \
            self._spin(case, out, before, after) or self._cache(case, before, after, cost)
        if found:
            return found
        if self.limits.fd_growth and before.fds is not None and after.fds is not None:
            fds = self._settled_fds(before.fds, after.fds)
            if fds > before.fds:
                return _fd_signature(), (f"{fds - before.fds} descriptor(s) more after the "
                                         f"connection and the health probe closed ({before.fds}"
                                         f" -> {fds})")
        return None

    def judge_stream(self, case: Case, out: Outcome, before: Snapshot) -> str | None:
        """Campaign sampling: the kind of oracle that fired for this case, or None. A trigger
        is only a suspicion: the runner confirms it with :meth:`judge_isolated`."""
        self._drain_probe()
        now = self.snapshot()
        if now.pid is None:
            return None
        if now.starts != self._starts or self._first is None or now.pid != self._first.pid:
            self._starts, self._first, self._window = now.starts, now, now
            self._window_cost, self._total_cost = CaseCost(), CaseCost()
            self._fds_low = now.fds
        cost = case_cost(case, _sent(case, out))
        self._window_cost.add(cost)
        self._total_cost.add(cost)
        kind = None
        if self._frozen:
            kind = FREEZE
        elif (self.limits.spin_seconds and before.cpu is not None and now.cpu is not None
              and now.cpu - before.cpu > self.limits.spin_seconds):
            kind = SPIN
        elif self._amplified(self._window.rss, self._window_cost) or \
                self._amplified(before.rss, cost, self._peak_rss()):  # this case's own peak
            kind = AMPLIFICATION
        elif self.limits.cache and (
                now.cache_files - self._first.cache_files > self._total_cost.uploads
                or now.cache_bytes - self._first.cache_bytes > self._total_cost.upload_bytes):
            kind = CACHE
        elif (self.limits.fd_growth and now.fds is not None and self._fds_low is not None
              and now.fds - self._fds_low >= self.limits.fd_growth):
            kind = FD_LEAK
        if now.fds is not None and self._fds_low is not None:
            self._fds_low = min(self._fds_low, now.fds)
        # A window that can explain any growth up to the floor is closed; so is one that
        # fired (a suspicion is judged once) or whose memory went down.
        w = self._window
        if kind or w.rss is None or now.rss is None or now.rss < w.rss or \
                self.limits.amplification * (self._window_cost.bytes + self._window_cost.alloc) \
                >= self.limits.amplification_floor:
            self._window, self._window_cost = now, CaseCost()
        if kind:
            self.triggers += 1
            if kind in (CACHE, FD_LEAK):
                self._first, self._total_cost, self._fds_low = now, CaseCost(), now.fds
        return kind

    # ---------------------------------------------------------------- the oracles
    def _freeze(self, case: Case):
        if not self._frozen:
            return None
        detail = self._frozen
        # Does it take this command, or does any frame do it? (Held after HELLO and the first
        # byte of the next header, a server cannot know yet what the frame will be.)
        if self._holding_one_byte_freezes():
            self.freezes_any = True
            cmd = ANY_FRAME
            detail += "; also with HELLO + 1 byte of a frame held, so whatever the command"
        else:
            at = open_frame_step(case)
            cmd = case.steps[at].cmd if at is not None else case.steps[-1].cmd
        return Signature(FREEZE, "", "a connection held mid-frame stopped the server serving "
                         "other clients", cmd), detail

    def _holding_one_byte_freezes(self) -> bool:
        t = self.target
        byte = pack_request(get_dialect(t.dialect or DEFAULT.name), GetAlignmentRequest())[:1]
        return _hello_then(t, self.limits.freeze_wait, lambda held: not _answers_hello(
            t, self.limits.freeze_wait, unblock=lambda: _close(held)), tail=byte)

    def _spin(self, case: Case, out: Outcome, before: Snapshot, after: Snapshot):
        if not self.limits.spin_seconds or before.cpu is None or after.cpu is None:
            return None
        used = after.cpu - before.cpu
        if used <= self.limits.spin_seconds:
            return None
        cmd = _slowest_command(case, out)
        return Signature(SPIN, "", "one connection kept the server busy beyond the CPU bound",
                         cmd), (f"{used:.2f} s of CPU on one connection (bound "
                                f"{self.limits.spin_seconds:g} s); slowest answer: {cmd}")

    def _amplified(self, base: int | None, cost: CaseCost, now: int | None = None) -> bool:
        now = self._rss_during if now is None else now
        if not self.limits.amplification or base is None or now is None:
            return False
        growth = now - base
        return growth > self.limits.amplification_floor and \
            growth > self.limits.amplification * (cost.bytes + cost.alloc)

    def _amplification(self, case: Case, out: Outcome, base: int | None, cost: CaseCost):
        peak = max(self._rss_during or 0, self._rss() or 0, self._peak_rss() or 0)
        if not self._amplified(base, cost, peak):
            return None
        from .case_runner import culprit
        growth = peak - base
        return Signature(AMPLIFICATION, "", "resident memory grew far beyond what the "
                         "connection sent and asked for", culprit(case, out)), \
            (f"RSS +{growth >> 20} MiB for {cost.bytes:,} request bytes and {cost.alloc:,} "
             f"buffer bytes asked for (bound {self.limits.amplification:g}x, floor "
             f"{self.limits.amplification_floor >> 20} MiB)")

    def _cache(self, case: Case, before: Snapshot, after: Snapshot, cost: CaseCost):
        if not self.limits.cache:
            return None
        files, size = written(before.cache_entries or {}, after.cache_entries or {})
        if files <= cost.uploads and size <= cost.upload_bytes:
            return None
        uploads = [s.cmd for s in case.steps if s.cmd.startswith("SET_TENSOR")]
        cmd = uploads[0] if uploads else case.steps[-1].cmd
        return Signature(CACHE, "", "the cache directory grew beyond the uploads that asked "
                         "to be cached", cmd), \
            (f"{files} file(s), {size:,} bytes written for {cost.uploads} upload(s) with "
             f"cache_flag set ({cost.upload_bytes:,} bytes)")

    def _settled_fds(self, before: int, now: int) -> int:
        """The descriptor count once the server has closed what it will (up to FD_SETTLE).
        Polled from 1 ms, doubling: a server closes a finished connection's descriptor
        within a millisecond or two, and a first wait of 20 ms was a tenth of a p7 worker's
        time."""
        end = time.monotonic() + FD_SETTLE
        p = self._process()
        pause = 0.001
        while now > before and p is not None and time.monotonic() < end:
            time.sleep(pause)
            pause = min(pause * 2, 0.02)
            try:
                now = p.num_fds()
            except psutil.Error:
                return before
        return now


def _fd_signature() -> Signature:
    # A descriptor leaks per connection, whatever its requests: one finding, not one per
    # command the leaking connections happened to end with.
    return Signature(FD_LEAK, "", "open descriptors grow with each connection", "connection")


def _sent(case: Case, out: Outcome) -> int:
    """The steps whose cost may justify what the server did: up to where the run ended, and
    every frame the client had written by then (a pipelined server may read and serve frames
    past the step a close is pinned to: a real p7 cached an upload at step 16 of a case whose
    end was pinned earlier, and the oracle called the file unasked for)."""
    if out.at is None:
        return len(case.steps)
    return min(max(out.at + 1, out.frames_sent), len(case.steps))


def _slowest_command(case: Case, out: Outcome) -> str:
    """The request of the slowest answered batch: its mutated step, else the answered one."""
    if out.slowest is None or not case.steps:
        return case.steps[-1].cmd if case.steps else "NONE"
    first, last, _ = out.slowest
    for s in case.steps[first:last + 1]:
        if s.mutated:
            return s.cmd
    return case.steps[min(last, len(case.steps) - 1)].cmd


def _hello_frame(target: Target) -> bytes:
    from ..strategies import hello_request_frame
    return hello_request_frame(target.dialect or DEFAULT.name)


def _answers_hello(target: Target, timeout: float, *, unblock=None) -> bool:
    """A HELLO on a fresh connection, answered within ``timeout``? When it is not,
    ``unblock()`` (close what holds the server) is called and the late answer read before
    closing: a C server that writes it to a closed socket dies of SIGPIPE (the real 7.0.0
    server does)."""
    try:
        with socket.create_connection((target.host, target.port), timeout=timeout) as s:
            s.sendall(_hello_frame(target))
            try:
                recv_exact(s, 8)
                return True
            except OSError:
                if unblock is None:
                    raise
                unblock()
                s.settimeout(max(timeout, 2.0))
                recv_exact(s, 8)
                return False
    except OSError:
        return False


def _probe(target: Target, timeout: float) -> tuple[bool, socket.socket | None]:
    """(answered, the still open socket when not)."""
    try:
        s = socket.create_connection((target.host, target.port), timeout=timeout)
    except OSError:
        return False, None
    try:
        s.sendall(_hello_frame(target))
        recv_exact(s, 8)
    except OSError:
        return False, s
    _close(s)
    return True, None


def _hello_then(target: Target, timeout: float, then, *, tail: bytes = b"") -> bool:
    """HELLO on a first connection (answered), then ``tail`` on it, then ``then(first)``."""
    try:
        with socket.create_connection((target.host, target.port), timeout=timeout) as first:
            first.sendall(_hello_frame(target))
            head = recv_exact(first, 8)
            recv_exact(first, int.from_bytes(head, "little"))
            if tail:
                first.sendall(tail)
                time.sleep(0.02)
            return then(first)
    except OSError:
        return False


def _serves_two(target: Target, timeout: float) -> bool:
    """Is a second client answered while a first one sits idle between frames?"""
    return _hello_then(target, timeout, lambda first: _answers_hello(
        target, timeout, unblock=lambda: _close(first)))


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
