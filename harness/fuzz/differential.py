"""``harness fuzz --differential A B``: the same sessions against two servers, every
difference between them a finding.

Both targets (pins, user builds, ``ref-DIALECT``, ``ref:KNOB=V``) are launched the same way
(no cache directory on either: the same cache setting) and get the same generated and evolved
cases (:mod:`.generate`, :mod:`.evolve`). Per case and side, :meth:`CaseRunner.check` gives
the outcome and whether the side broke; the two are compared (:func:`compare`):

* **death** -- one side crashed, hung, grew too big or broke the connection rules and the
  other did not (or both broke, differently);
* **close** -- the connections ended differently: status (answered everything, closed,
  hang) or the step they ended at;
* **answer** -- the first answer whose bytes differ, after *pointer renaming*: buffer handles
  and bases (ALLOC_BUFFER, BUFFER_GET_BASE answers) are heap addresses and compare only as
  "zero or not".

An allow-list (:data:`DEFAULT_ALLOW` plus ``--allow FILE``, YAML or JSON) names intended or
host-dependent differences: ``{cmd, kind: answer, bytes: [start, end], reason}`` masks those
answer bytes of that command (no ``bytes``: the whole payload, sizes still compared),
``{cmd, kind: close|death}`` ignores such divergences at that command; ``match`` (a regular
expression) narrows an entry to divergences whose line contains it (a death by its assert; a
close point as ``close point: A ok, B closed <- framing:len_large``, the mutation it is
blamed on, and ``same-step`` when both answered as many steps; an answer as ``A <payload hex> / B <payload hex>``: such an entry masks nothing, it
passes the answers it matches). Each divergence not
allowed is deduplicated by its signature, minimised by delta debugging (both targets checked
per attempt) and saved under ``divergences/<id>/`` with the case (``repro.rpct``) and both
sides' transcripts (``a.rpct``, ``b.rpct``); ``harness replay DIR --differential A B``
replays it.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import yaml
from hypothesis import HealthCheck, Phase, Verbosity, given, seed as hyp_seed, settings
from hypothesis import strategies as st

from ..proto import Cmd, get_dialect
from ..proto.codec import REQUEST_HEADER_SIZE, unpack_request_payload
from ..proto.errors import ProtocolError
from ..proto.tensor import TENSOR_FIELD_OFFSETS
from ..proto.wire import U64, iter_response_payloads
from .errors import FuzzError
from ..capture.pcap import write_pcap
from ..data import ALLOW_LISTS, shipped
from .campaign import SWEEP_SHARE, Progress, _is_hypothesis_error
from .bounds import ACCEPTED_OOB
from .case import BASE, HANDLE, Case, Step
from .evolve import Corpus, behaviour, mutate
from .execute import Outcome
from .generate import cases
from .replay import load
from .report import (DEFAULT_MIN_MESSAGES, _sweep_row, campaign_problems, phases_lines,
                     phases_summary)
from .case_runner import CaseRunner, Finding
from .shrink import Budget, minimise_case, transcript_of
from .sweep import PARTS, prepare, size as sweep_size, sweep as sweep_cases
from .written import unwritten_ranges
from .target import DEFAULT_AS_LIMIT, DEFAULT_RSS_LIMIT, Target
from .signature import Signature, normalise, slug
from .target_spec import TargetSpec

FORMAT = "ggml-rpc-fuzz-divergence/1"
_LEARNED = {"ALLOC_BUFFER": (0,), "BUFFER_GET_BASE": (0,)}  # u64 words holding heap addresses

#: Differences that are not bugs: the same on every run of any two builds.
UNWRITTEN = "unwritten"  # an answer entry's bytes: those the session did not write
DEFAULT_ALLOW: list[dict] = [
    {"cmd": "GET_DEVICE_MEMORY", "kind": "answer",
     "reason": "free and total device memory are the host's (and the server's budget)"},
    {"cmd": "GET_TENSOR", "kind": "answer", "bytes": UNWRITTEN,
     "reason": "bytes never written: a fresh buffer holds what its allocator left there (only "
               "bytes the session did not write, harness/fuzz/written.py, are masked)"},
    {"cmd": "GET_TENSOR_2D", "kind": "answer", "bytes": UNWRITTEN,
     "reason": "bytes never written: a fresh buffer holds what its allocator left there (only "
               "bytes the session did not write, harness/fuzz/written.py, are masked)"},
    {"cmd": "*", "kind": "close", "match": r" same-step$",
     "reason": "both answered the same steps and nothing answered follows: whether a client "
               "sees the close before it has sent the rest is timing, which the wire cannot "
               "prove either way (two identical servers differ here)"},
]


class DifferentialError(FuzzError, ValueError):
    """Bad differential set-up (allow-list file, targets of different dialects)."""


SHIPPED_ALLOW_DIR = shipped(ALLOW_LISTS)


def shipped_allow_list(dialect: str) -> Path | None:
    """The allow-list shipped for a dialect's real builds (harness/data/differential), if any."""
    path = SHIPPED_ALLOW_DIR / f"allow-{dialect}.yaml"
    return path if path.is_file() else None


def load_allow(path: Path | None, *, defaults: bool = True,
               _including: set[Path] | None = None) -> list[dict]:
    entries = list(DEFAULT_ALLOW) if defaults else []
    if path is None:
        return entries
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise DifferentialError(f"cannot read allow-list {path}: {e}") from None
    if not isinstance(data, list):
        raise DifferentialError(f"{path}: an allow-list is a list of entries")
    for e in data:
        if isinstance(e, dict) and set(e) == {"include"}:
            # another list's entries (a patched build shares its base's real-server bugs)
            chain = (_including or set()) | {Path(path).resolve()}
            included = Path(path).parent / str(e["include"])
            if included.resolve() in chain:
                raise DifferentialError(f"{path}: include cycle through {included}")
            entries += load_allow(included, defaults=False, _including=chain)
            continue
        if not isinstance(e, dict) or "cmd" not in e or e.get("kind", "answer") not in (
                "answer", "close", "death"):
            raise DifferentialError(f"{path}: bad entry {e!r} (needs cmd, kind answer|close|"
                                    "death, optional bytes: [start, end], reason)")
        if "match" in e:
            try:
                re.compile(e["match"])
            except (re.error, TypeError) as err:
                raise DifferentialError(f"{path}: bad match {e['match']!r}: {err}") from None
        b = e.get("bytes")
        if b is not None and b != UNWRITTEN and not (
                isinstance(b, list) and len(b) == 2 and all(isinstance(x, int) and x >= 0
                                                            for x in b)):
            raise DifferentialError(f"{path}: bytes must be [start, end] or {UNWRITTEN!r}, "
                                    f"not {b!r}")
        entries.append({"kind": "answer", **e, "_from": str(path)})
    if _including is None:
        # an entry that repeats another (often one an include already holds) can never let a
        # session pass (the first match takes it), and its count of 0 reads as a stale entry
        first: dict[tuple, str] = {}
        for e in entries:
            key = (e["cmd"], e["kind"], repr(e.get("bytes")), e.get("match"))
            if key in first:
                raise DifferentialError(
                    f"{e['_from']}: the entry {e['cmd']} {e['kind']} "
                    f"{e.get('match') or ''} repeats one in {first[key]}")
            first[key] = e.pop("_from", "the built-in list")
    return entries


# ---------------------------------------------------------------- comparing two runs

def answers(case: Case, out: Outcome) -> list[tuple[int, str, bytes]]:
    """(step, command, payload) of every answer in the recorded run, in order."""
    stream = b"".join(data for d, _, data in (out.log or []) if d == "s2c")
    payloads = iter_response_payloads(stream)  # the last may be cut: beyond what is kept
    steps = ((i, s.cmd) for i, s in enumerate(case.steps) for _ in s.expect)
    return [(i, cmd, payload) for (i, cmd), (_, payload) in zip(steps, payloads)]


def _renamed(cmd: str, payload: bytes) -> bytes:
    """Heap addresses replaced by "zero or not" (they differ between processes)."""
    words = _LEARNED.get(cmd)
    if not words:
        return payload
    buf = bytearray(payload)
    for w in words:
        if len(buf) >= 8 * (w + 1):
            v = U64.unpack_from(buf, 8 * w)[0]
            U64.pack_into(buf, 8 * w, 1 if v else 0)
    return bytes(buf)


def _masked(cmd: str, payload: bytes, allow: list[dict],
            unwritten: list[tuple[int, int]] | None = None) -> bytes:
    """The payload with the bytes the entries mask zeroed: ``bytes: [start, end]``, the bytes
    the session never wrote (``bytes: unwritten``, from ``unwritten``), or all of it."""
    buf = bytearray(payload)
    for e in allow:
        if e["kind"] != "answer" or e["cmd"] != cmd or "match" in e:
            continue
        b = e.get("bytes")
        if b == UNWRITTEN:  # a read the tracker could not place: all of it may be unwritten
            spans = unwritten if unwritten is not None else [(0, len(buf))]
        else:
            spans = [tuple(b) if b else (0, len(buf))]
        for start, end in spans:
            buf[start:min(end, len(buf))] = bytes(max(0, min(end, len(buf)) - start))
    return bytes(buf)


# A handle plus less than this names, in the real server, possibly another live buffer: its
# handles are malloc'd structs a few hundred bytes apart (the reference's are 1 MiB apart).
NEAR_HANDLE = 1 << 12


# In a tensor record, the data pointer lies this many bytes after the buffer field.
_DATA_AFTER_BUFFER = TENSOR_FIELD_OFFSETS["data"] - TENSOR_FIELD_OFFSETS["buffer"]


def _alloc_size(dialect: str, frame: bytes) -> int | None:
    try:
        return unpack_request_payload(get_dialect(dialect), Cmd.ALLOC_BUFFER,
                                      frame[REQUEST_HEADER_SIZE:]).size
    except (ProtocolError, KeyError, ValueError):
        return None  # a malformed ALLOC_BUFFER: its size says nothing


def _cross_base(s: Step, sizes: dict[int, int | None], runs: tuple[Outcome, ...]) -> bool:
    """Does a tensor of step ``s`` name buffer j while its data pointer is given relative to
    another buffer i's base, past buffer i's bounds? Whether it then lies inside buffer j is
    where the allocator put the two buffers (p8 puts a 64 KiB buffer 0x480 bytes after a
    1 KiB one, p7 0x7440 after it, the reference 1 MiB apart), not the protocol. Where both
    sides learned both bases, only a pointer inside j on one side and not the other counts."""
    named = {r.offset: r.index for r in s.relocs if r.kind == HANDLE and r.addend == 0}
    for r in s.relocs:
        j = named.get(r.offset - _DATA_AFTER_BUFFER)
        size_i = sizes.get(r.index)
        if r.kind != BASE or j is None or j == r.index or size_i is None \
                or 0 <= r.addend <= size_i:
            continue
        size_j = sizes.get(j)
        learned = [o.live.get(BASE, []) for o in runs]
        if runs and size_j is not None and all(
                max(r.index, j) < len(b) and b[r.index] and b[j] for b in learned) and len(
                {b[j] <= b[r.index] + r.addend < b[j] + size_j for b in learned}) == 1:
            continue  # inside buffer j on both sides or on neither: the layout did not decide
        return True
    return False


def _close_causes(case: Case, lo: int, hi: int, runs: tuple[Outcome, ...] = ()) -> str:
    """What a close point may be blamed on, for allow-list matching: ``kind:what`` of every
    mutated step from the last step both sides answered to the first one neither did
    (``framing:len_large field:ne_extreme``, and ``kind:what:case`` for a sweep case:
    ``field:graph_class:tensors_past_bound``; ``valid`` if none), plus ``stale-base`` /
    ``stale-handle`` when a step where the first side to stop may have stopped (from ``lo``
    to the next step with an answer) names a buffer freed before it, and not allocated again
    since, by a data pointer / by its handle, and ``near-handle`` when such a step names a
    handle plus a few bytes (another live buffer's handle on the real server, when malloc
    placed the two handle structs that far apart), and ``cross-base`` when such a step has a
    tensor naming one buffer with data given past another buffer's bounds
    (:func:`_cross_base`). What malloc does with freed memory is the
    allocator's choice: the real server sometimes places a later buffer over the freed
    range, and gives the freed handle struct to the next ALLOC_BUFFER only when no request
    in between took that chunk (the same steps after other sessions on the same process go
    either way), while the reference never hands memory out twice and always reuses the
    last freed handle. So those are compared as symbols, not as outcomes."""
    tags = set()
    stop = next((k for k in range(lo, len(case.steps)) if case.steps[k].expect), hi)
    freed: set[int] = set()  # buffer indices whose last event so far is a FREE_BUFFER
    sizes: dict[int, int | None] = {}  # buffer index -> the size its ALLOC_BUFFER asked for
    for at, s in enumerate(case.steps[:min(max(hi, stop) + 1, len(case.steps))]):
        if lo <= at <= hi and s.desc:
            tags.add(f"{s.desc.get('kind')}:{s.desc.get('what')}")
            if s.desc.get("case"):  # a sweep case, so an entry can name one boundary
                tags.add(f"{s.desc['kind']}:{s.desc['what']}:"
                         + re.sub(r"\s+", "_", str(s.desc["case"])))
        if lo <= at <= stop:
            if any(r.kind == BASE and r.index in freed for r in s.relocs):
                tags.add("stale-base")
            if any(r.kind == HANDLE and r.addend == 0 and r.index in freed for r in s.relocs):
                tags.add("stale-handle")
            if any(r.kind == HANDLE and 0 < abs(r.addend) < NEAR_HANDLE for r in s.relocs):
                tags.add("near-handle")
            if _cross_base(s, sizes, runs):
                tags.add("cross-base")
        if s.cmd == "FREE_BUFFER":
            freed |= {r.index for r in s.relocs if r.kind == HANDLE and r.addend == 0}
        elif s.learn is not None and s.learn[0] == HANDLE:
            freed.discard(s.learn[1])
            sizes[s.learn[1]] = _alloc_size(case.dialect, s.frame) \
                if s.cmd == "ALLOC_BUFFER" else None
    return " ".join(sorted(tags)) or "valid"


def _further(proven_a: int, proven_b: int) -> str:
    """Which side answered more steps before its connection ended, for allow-list matching:
    ``same-step``, ``a-further`` (the first target of ``--differential A B``) or
    ``b-further``."""
    if proven_a == proven_b:
        return "same-step"
    return "a-further" if proven_a > proven_b else "b-further"


def _allowing(allow: list[dict], kind: str, cmd: str, line: str = "") -> dict | None:
    """The first entry naming the kind and command (``cmd: "*"``: any) whose optional
    ``match``, a regular expression, the divergence's line contains (e.g. one assert of one
    side); None if no entry allows it. An answer entry without ``match`` masks bytes
    (:func:`_masked`): it lets no line pass."""
    return next((e for e in allow if e["kind"] == kind and e["cmd"] in (cmd, "*")
                 and (kind != "answer" or "match" in e)
                 and (e.get("match") is None or re.search(e["match"], line))), None)


def _allowed(allow: list[dict], kind: str, cmd: str, line: str = "") -> bool:
    return _allowing(allow, kind, cmd, line) is not None


@dataclass
class Divergence:
    signature: Signature
    detail: str
    step: int | None = None  # the step named as the cause
    culprit: Step | None = None  # that step (minimisation keeps it)


def compare(case: Case, runs: list[tuple[Finding | None, Outcome]], labels: tuple[str, str],
            allow: list[dict], used: list[dict] | None = None) -> Divergence | None:
    """How side B's run differs from side A's, or None (the first difference only).
    ``used`` collects the allow-list entries that let a difference pass."""
    def allowed_by(entry: dict | None) -> bool:
        if entry is not None and used is not None:
            used.append(entry)
        return entry is not None

    (va, oa), (vb, ob) = runs
    ka = va.signature if va else None
    kb = vb.signature if vb else None
    if ka is not None or kb is not None:
        if ka is not None and kb is not None and ka.same_bug(kb, command=False) \
                and ka.kind != ACCEPTED_OOB:
            # both broke the same way: no difference (but two servers that both accept memory
            # outside their buffers are each a finding: harness.fuzz.bounds)
            return None
        cmd = (ka or kb).command
        side = [f"{lab}: {k.title() if k else 'survived'}" for lab, k in zip(labels, (ka, kb))]
        which = ("both" if ka and kb else labels[0] if ka else labels[1])
        line = f"{which} broke: " + " / ".join(
            f"{k.kind} {k.signal} {k.line}".strip() if k else "survived" for k in (ka, kb))
        if allowed_by(_allowing(allow, "death", cmd, line)):
            return None
        return Divergence(Signature("divergence", "", normalise(line), cmd), "; ".join(side))
    # Where a connection ended, as far as the wire proves it: the steps answered before the
    # end (the step at which a pipelined client *notices* a close depends on timing).
    if (oa.status, oa.proven) != (ob.status, ob.proven) and case.steps:
        # The cause lies between the last step both answered and the first one only one
        # side answered: the first mutated step there, else the first step there.
        lo = min(oa.proven, ob.proven, len(case.steps) - 1)
        # Both answered as much (only the status differs): any later step may be the cause.
        hi = len(case.steps) if oa.proven == ob.proven else \
            min(max(oa.proven, ob.proven, lo + 1), len(case.steps))
        at = next((k for k in range(lo, hi) if case.steps[k].mutated), lo)
        cmd = case.steps[at].cmd
        line = f"close point: {labels[0]} {oa.status}, {labels[1]} {ob.status}"
        if not allowed_by(_allowing(allow, "close", cmd,
                                    f"{line} <- {_close_causes(case, lo, hi, (oa, ob))} "
                                    + _further(oa.proven, ob.proven))):
            return Divergence(
                Signature("divergence", "", line, cmd),
                f"{labels[0]}: {oa.status} after {oa.proven} answered steps ({oa.detail}); "
                f"{labels[1]}: {ob.status} after {ob.proven} ({ob.detail}); cause named: "
                f"step {at}", at, case.steps[at])
    gaps: dict[int, list[tuple[int, int]]] | None = None  # read only when an answer differs
    for (i, cmd, pa), (_, _, pb) in zip(answers(case, oa), answers(case, ob)):
        ra, rb = (_renamed(cmd, p) for p in (pa, pb))
        if ra == rb:
            continue
        masks = [e for e in allow if e["kind"] == "answer" and e["cmd"] == cmd
                 and "match" not in e]
        if gaps is None and any(e.get("bytes") == UNWRITTEN for e in masks):
            gaps = unwritten_ranges(case)
        ra, rb = (_masked(cmd, r, masks, (gaps or {}).get(i)) for r in (ra, rb))
        if ra == rb:
            allowed_by(masks[0])
        elif not allowed_by(_allowing(allow, "answer", cmd,
                                      f"{labels[0]} {pa.hex()} / {labels[1]} {pb.hex()}")):
            first = next((k for k in range(min(len(ra), len(rb))) if ra[k] != rb[k]),
                         min(len(ra), len(rb)))
            return Divergence(
                Signature("divergence", "", f"answer differs at payload byte {first}", cmd),
                f"step {i} {cmd}: {labels[0]} {pa[:32].hex()} / {labels[1]} {pb[:32].hex()}",
                i, case.steps[i])
    return None


# ---------------------------------------------------------------- the campaign

@dataclass
class DifferentialConfig:
    a: str
    b: str
    dialect: str | None = None
    duration: float = 120.0
    seed: int | None = None
    # Stop after this many sessions (a fixed seed then gives the same sessions on any
    # machine speed, where a duration gives more on a faster one); the duration still bounds.
    max_cases: int | None = None
    out: Path | None = None
    deadline: float = 5.0
    as_limit: int = DEFAULT_AS_LIMIT
    rss_limit: int = DEFAULT_RSS_LIMIT
    max_steps: int = 32
    shrink_seconds: float = 60.0
    allow: Path | None = None
    min_messages: int = DEFAULT_MIN_MESSAGES
    evolve_share: float = 0.8
    round_examples: int = 100
    keep_work: bool = False
    # the deterministic sweep first, for at most this share of the duration (its sessions
    # count towards max_cases); 0 leaves it out
    sweep_share: float = SWEEP_SHARE
    phases: tuple[str, ...] = PARTS  # which of the sweep's parts run
    sweep_only: bool = False  # stop once the sweep is done (max_cases may still add random)

    def to_json(self) -> dict:
        d = asdict(self)
        for k in ("out", "allow"):
            d[k] = str(d[k]) if d[k] is not None else None
        return d


class _Pair:
    """Both targets with their runners; a case runs on A and on B at once (each side mostly
    waits on its own server process: together they take the time of the slower one)."""

    def __init__(self, cfg: DifferentialConfig, work: Path):
        specs = [TargetSpec.parse(t, cfg.dialect) for t in (cfg.a, cfg.b)]
        self.labels = (specs[0].name, specs[1].name)
        self.targets = [Target(s, work / f"side{i}", as_limit=cfg.as_limit,
                               rss_limit=cfg.rss_limit, standby=True)
                        for i, s in enumerate(specs)]
        self.runners: list[CaseRunner] = []
        self.deadline = cfg.deadline
        self._side_b = ThreadPoolExecutor(1, thread_name_prefix="differential-b")

    def start(self) -> str:
        for t in self.targets:
            t.start()
        dialects = {t.dialect for t in self.targets}
        if len(dialects) != 1:
            raise DifferentialError(f"the targets speak different dialects "
                                    f"({', '.join(map(str, dialects))}): pass --dialect")
        self.runners = [CaseRunner(t, deadline=self.deadline) for t in self.targets]
        return self.targets[0].dialect

    def run(self, case: Case, *, lockstep: bool = False
            ) -> list[tuple[Finding | None, Outcome]]:
        b = self._side_b.submit(self.runners[1].check, case, record=True, lockstep=lockstep)
        a = self.runners[0].check(case, record=True, lockstep=lockstep)
        return [a, b.result()]

    def judge(self, case: Case, allow: list[dict], used: list[dict] | None = None
              ) -> tuple[Divergence | None, list[tuple[Finding | None, Outcome]]]:
        """Run ``case`` on both sides and compare. A close-point difference where a side
        closed with a reset is run again in lockstep: a reset discards answers the client
        had not read yet, so a pipelined run may show a close one step early that is not."""
        runs = self.run(case)
        got: list[dict] = []
        div = compare(case, runs, self.labels, allow, got)
        if div is not None and div.signature.line.startswith("close point") \
                and any(o.detail == "reset" for _, o in runs):
            runs = self.run(case, lockstep=True)
            got = []
            div = compare(case, runs, self.labels, allow, got)
        if used is not None:
            used.extend(got)
        return div, runs

    def stop(self) -> None:
        self._side_b.shutdown(wait=True)
        for t in self.targets:
            t.stop()


def run_differential(cfg: DifferentialConfig, *,
                     on_progress: Callable[[Progress], None] | None = None) -> tuple[Path, dict]:
    """Run the differential campaign; returns (report folder, report dict). ``on_progress``
    gets the same :class:`Progress` a campaign gives (for the live display)."""
    seed = cfg.seed if cfg.seed is not None else random.SystemRandom().randrange(1 << 31)
    specs = [TargetSpec.parse(t, cfg.dialect) for t in (cfg.a, cfg.b)]  # fail early
    out = Path(cfg.out) if cfg.out else \
        Path("reports") / f"fuzz-diff-{time.strftime('%Y%m%d-%H%M%S')}"
    (out / "divergences").mkdir(parents=True, exist_ok=True)
    allow = load_allow(cfg.allow)
    pair = _Pair(cfg, out / "work")
    stats = {"cases": 0, "frames": 0, "generated": 0, "evolved": 0, "divergences_seen": 0,
             "allowed": 0, "both_broke": 0, "restarts": 0, "sweep_total": 0, "sweep_done": 0}
    sweep_seconds = 0.0
    sweep_timing: Counter = Counter()  # seconds per deterministic phase
    sweeping = False
    findings: list[dict] = []
    seen: set[str] = set()
    hits = [0] * len(allow)  # sessions each allow-list entry let pass
    errors: list[dict] = []
    t0 = time.time()
    end = t0 + cfg.duration

    def more() -> bool:
        return time.time() < end and (cfg.max_cases is None or stats["cases"] < cfg.max_cases)
    rng = random.Random(seed)
    corpus = Corpus()
    dialect = None
    progress = Progress()

    def emit() -> None:
        progress.handle({"type": "stats", "worker": 0,
                         "stats": {**stats, "restarts": sum(r.restarts for r in pair.runners)}})
        if on_progress is not None:
            on_progress(progress)
    try:
        dialect = pair.start()
        local_only = not all(s.is_reference for s in specs)
        strategy = cases(dialect, max_steps=cfg.max_steps, local_only=local_only)
        sweeping = cfg.sweep_share > 0 or cfg.sweep_only
        if sweeping:
            # set-up, as in a campaign's worker: built (or read from the cache) before the
            # clock starts, or a first run after an upgrade spends its time on it
            prepare(dialect, local_only=local_only)
        t0 = time.time()  # the servers' start is set-up too
        end = t0 + cfg.duration

        def one(case: Case) -> None:
            used: list[dict] = []
            div, runs = pair.judge(case, allow, used)
            stats["cases"] += 1
            stats["frames"] += sum(o.frames_sent for _, o in runs)
            if runs[0][0] is None and runs[1][0] is None:
                corpus.offer(case, behaviour(case, runs[0][1]))
            elif runs[0][0] is not None and runs[1][0] is not None:
                stats["both_broke"] += 1
            if div is None:
                if used:
                    stats["allowed"] += 1
                for e in {id(e): e for e in used}.values():
                    hits[allow.index(e)] += 1
                return
            stats["divergences_seen"] += 1
            key = _dedupe_key(div)
            if key in seen:
                return
            seen.add(key)
            findings.append(_minimise_and_save(cfg, pair, allow, case, div, out, dialect,
                                               time.time() - t0))
            progress.handle({"type": "finding", "finding": findings[-1]})
            emit()

        if sweeping:
            stats["sweep_total"] = sweep_size(dialect, local_only=local_only, only=cfg.phases)
            if on_progress is not None:
                on_progress(progress)
            share = 1.0 if cfg.sweep_only else cfg.sweep_share
            stop, s0 = t0 + share * cfg.duration, time.time()
            last = s0
            for item in sweep_cases(dialect, local_only=local_only, only=cfg.phases):
                if not more() or time.time() >= stop:
                    break
                one(item.case)
                stats["sweep_done"] += 1
                now = time.time()
                sweep_timing[f"sweep:{item.part}"] += now - last
                last = now
            else:  # exhausted: the count was an upper bound
                stats["sweep_total"] = stats["sweep_done"]
            sweep_seconds = time.time() - s0
            emit()
        round_no = 0
        # after a --sweep-only sweep, random sessions only up to max_cases
        while more() and not (cfg.sweep_only and cfg.max_cases is None):
            @settings(database=None, max_examples=cfg.round_examples, deadline=None,
                      phases=(Phase.generate,), suppress_health_check=list(HealthCheck),
                      verbosity=Verbosity.quiet)
            @hyp_seed(seed * 1_000_003 + round_no)
            @given(st.data())
            def generated(data):
                if more():
                    case = data.draw(strategy)
                    stats["generated"] += 1
                    one(case)
            n0 = stats["generated"]
            try:
                generated()
            except Exception as e:  # noqa: BLE001 - hypothesis reports (Flaky...) end the round
                if not _is_hypothesis_error(e):
                    raise
            round_no += 1
            share = min(max(cfg.evolve_share, 0.0), 0.99)
            for _ in range(int((stats["generated"] - n0) * share / (1 - share))):
                if not more() or not corpus:
                    break
                stats["evolved"] += 1
                one(mutate(corpus.pick(rng), corpus, rng))
                if stats["evolved"] % 50 == 0:
                    emit()
            emit()
    except (DifferentialError, OSError) as e:
        errors.append({"error": str(e)})
    finally:
        stats["restarts"] = sum(r.restarts for r in pair.runners)
        started = [t.starts for t in pair.targets]
        pair.stop()
        if not cfg.keep_work:
            shutil.rmtree(out / "work", ignore_errors=True)
    elapsed = max(time.time() - t0, 1e-9)
    report = {
        "format": "ggml-rpc-fuzz-differential/1", "a": cfg.a, "b": cfg.b,
        "labels": list(pair.labels), "target": f"{cfg.a} vs {cfg.b}",
        "target_kind": "differential", "dialect": dialect, "seed": seed,
        "duration_s": cfg.duration, "elapsed_s": round(elapsed, 1),
        "messages_sent": stats["frames"], "messages_per_s": round(stats["frames"] / elapsed, 1),
        "cases": stats["cases"], "stats": stats,
        "allow": [{**e, "sessions": n} for e, n in zip(allow, hits)],
        "findings": findings, "distinct_signatures": len(findings),
        "nothing_found": not findings and not errors, "errors": errors,
        "sweep": {"cases": stats["sweep_total"], "done": stats["sweep_done"],
                  "complete": stats["sweep_done"] >= stats["sweep_total"],
                  "seconds": round(sweep_seconds, 1), "share": cfg.sweep_share},
        "workers_never_listened": [i for i, n in enumerate(started) if not n],
        "config": cfg.to_json(),
    }
    if sweeping and dialect is not None:
        report["sweep"].update(phases_summary(dialect, [((1, 1), stats["sweep_done"])],
                                              sweep_timing, cfg.phases))
    report["problems"] = campaign_problems(report, cfg.min_messages)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "report.md").write_text(render_markdown(report))
    return out, report


def _dedupe_key(div: Divergence) -> tuple:
    """One finding per difference: a side that broke is one bug whatever step it was named
    after (a pipelined run names the command only roughly); other divergences are per
    command."""
    sig = div.signature
    if " broke: " in sig.line:
        return (sig.line,)
    if not sig.line.startswith("close point"):
        return sig.line, sig.command  # an answer: its step is known exactly
    # A close is blamed on a step of a window: its mutation tells causes apart.
    what = div.culprit.desc["what"] if div.culprit is not None and div.culprit.desc else ""
    return sig.line, sig.command, what


def finding_id(div: Divergence) -> str:
    """Folder name of a divergence: one per deduplication key (two close-point divergences
    of one command blamed on different mutations are two findings)."""
    digest = hashlib.sha1(repr(_dedupe_key(div)).encode()).hexdigest()[:8]
    return f"divergence-{slug(div.signature.command)}-{digest}"


def _minimise_and_save(cfg, pair: _Pair, allow, case: Case, div: Divergence, out: Path,
                       dialect: str, found_after: float) -> dict:
    t0 = time.monotonic()
    budget = Budget(cfg.shrink_seconds)

    def same(c: Case) -> bool:
        d, _ = pair.judge(c, allow)
        # The same difference, blamed on the same step (not another one that differs too).
        return d is not None and _dedupe_key(d) == _dedupe_key(div) and d.culprit == div.culprit

    minimal = minimise_case(case, same, budget) if len(case.steps) > 1 else case
    final, runs = pair.judge(minimal, allow)
    if final is None or _dedupe_key(final) != _dedupe_key(div):  # timing: keep the original
        minimal, final = case, div
        runs = pair.judge(case, allow)[1]
    # `harness replay` starts both targets afresh: say whether that shows it (no: the outcome
    # depends on what earlier sessions left in a server process, such as its heap's layout)
    fresh, _ = run_pair(minimal, cfg.a, cfg.b, dialect=dialect, deadline=cfg.deadline,
                        allow=allow)
    return save_divergence(out / "divergences" / finding_id(div), minimal, runs, final,
                           cfg=cfg, labels=pair.labels, dialect=dialect,
                           extra={"original_steps": len(case.steps),
                                  "minimise_seconds": round(time.monotonic() - t0, 1),
                                  "minimise_attempts": budget.attempts,
                                  "found_after_s": round(found_after, 1),
                                  "replays_on_fresh_targets": fresh is not None
                                  and _dedupe_key(fresh) == _dedupe_key(div)})


def save_divergence(folder: Path, case: Case, runs, div: Divergence, *, cfg, labels,
                    dialect: str, extra: dict) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"format": FORMAT, "signature": div.signature.to_json(), "a": cfg.a, "b": cfg.b,
            "dialect": dialect, "case": case.to_json()}
    transcript_of(case, None, meta).save(folder / "repro.rpct")
    for name, (_, o) in zip(("a", "b"), runs):
        tr = transcript_of(case, o, {**meta, "side": name})
        tr.save(folder / f"{name}.rpct")
        write_pcap(tr, folder / f"{name}.pcap")
    finding = {"format": FORMAT, "id": folder.name, "signature": div.signature.to_json(),
               "title": div.signature.title(), "detail": div.detail, "step": div.step,
               "a": cfg.a, "b": cfg.b, "labels": list(labels), "dialect": dialect,
               "steps": len(case.steps), "listing": case.describe(),
               "outcomes": [{"status": o.status, "at": o.at,
                             "broke": v.signature.title() if v else None} for v, o in runs],
               "replay": f"harness replay {folder}/repro.rpct --differential {cfg.a} {cfg.b}",
               **extra}
    (folder / "finding.json").write_text(json.dumps(finding, indent=1) + "\n")
    return finding


def replay_differential(path: Path, a: str, b: str, *, dialect: str | None = None,
                        deadline: float = 5.0, allow: Path | None = None,
                        used: list[dict] | None = None) -> Divergence | None:
    """Run a saved case once against fresh A and B; the divergence it shows, or None.
    ``used`` collects the allow-list entries that let a difference pass (None with none
    used: the two agreed)."""
    case, _, _ = load(path)
    return run_pair(case, a, b, dialect=dialect, deadline=deadline,
                    allow=load_allow(allow), used=used)[0]


def run_pair(case: Case, a: str, b: str, *, dialect: str | None = None, deadline: float = 5.0,
             allow: list[dict] | None = None, used: list[dict] | None = None
             ) -> tuple[Divergence | None, list[tuple[Finding | None, Outcome]]]:
    """Run ``case`` once against fresh A and B: the divergence (``allow``: the default
    allow-list when None) and both sides' runs; ``used`` as in :func:`compare`."""
    cfg = DifferentialConfig(a=a, b=b, dialect=dialect or case.dialect, deadline=deadline)
    with tempfile.TemporaryDirectory(prefix="harness-diff-") as tmp:
        pair = _Pair(cfg, Path(tmp))
        try:
            pair.start()
            return pair.judge(case, load_allow(None) if allow is None else allow, used)
        finally:
            pair.stop()


def render_markdown(r: dict) -> str:
    s = r["stats"]
    lines = [f"# Differential fuzzing: {r['a']} vs {r['b']} (dialect {r['dialect']})", ""]
    if r.get("problems"):
        lines += ["**The campaign did not test the targets**: " + "; ".join(r["problems"]) + ".",
                  ""]
    lines += [("**No divergence**" if r["nothing_found"] else
               f"**{r['distinct_signatures']} divergence(s)**")
              + f" in {r['cases']:,} sessions ({r['messages_sent']:,} messages to both sides) "
              f"over {r['elapsed_s']:.0f} s; seed {r['seed']}.", "",
              "| | |", "|---|---|",
              f"| sessions | {r['cases']:,}: {s.get('sweep_done', 0):,} of the sweep, "
              f"{s['generated']:,} generated, {s['evolved']:,} evolved |",
              _sweep_row(r.get("sweep")),
              f"| divergent sessions (not allow-listed / allow-listed) | {s['divergences_seen']:,} / "
              f"{s['allowed']:,} |",
              f"| sessions where both broke the same way | {s['both_broke']:,} |",
              f"| target restarts | {s['restarts']} |", ""]
    if r["errors"]:
        lines += ["## Errors", ""] + [f"* {e['error']}" for e in r["errors"]] + [""]
    lines += phases_lines(r.get("sweep"))
    lines += ["## Divergences", ""]
    for f in r["findings"]:
        lines += [f"### {f['id']}", "", f"{f['title']}", "", f"Detail: {f['detail']}", "",
                  f"Minimised from {f.get('original_steps')} to {f['steps']} steps; both sides' "
                  f"transcripts next to the reproducer (`a.rpct`, `b.rpct`). "
                  + ("Replays on freshly started targets." if f.get("replays_on_fresh_targets")
                     else "Does not replay on freshly started targets: the outcome depends on "
                          "what earlier sessions left in a server process (its heap, say)."),
                  "",
                  "```", f["replay"], "```", "", "```"] + f["listing"] + ["```", ""]
    if not r["findings"]:
        lines += ["None beyond the allow-list.", ""]
    lines += ["## Allow-list", "", "Sessions: how many divergent sessions each entry let pass.",
              "", "| command | kind | bytes | match | sessions | reason |",
              "|---|---|---|---|---|---|"]
    for e in r["allow"]:
        match = f"`{e['match']}`".replace("|", "\\|") if e.get("match") else ""
        lines.append(f"| {e['cmd']} | {e['kind']} | {e.get('bytes') or 'all'} | {match} | "
                     f"{e.get('sessions', 0):,} | {e.get('reason', '')} |")
    return "\n".join(lines + [""])
