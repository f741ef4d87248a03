"""Comparing two runs of one case: the first difference between the sides (a side that
broke, where the connections ended, an answer's bytes after pointer renaming), what it is
blamed on, and the key that makes one finding of many sessions (:func:`compare`)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from ..proto import Cmd, get_dialect
from ..proto.codec import REQUEST_HEADER_SIZE, unpack_request_payload
from ..proto.errors import ProtocolError
from ..proto.tensor import TENSOR_FIELD_OFFSETS
from ..proto.wire import U64, iter_response_payloads
from .bounds import ACCEPTED_OOB
from .case import BASE, HANDLE, Case, Step
from .execute import Outcome
from .case_runner import Finding
from .written import unwritten_ranges
from .signature import Signature, normalise, slug
from .allow_list import UNWRITTEN, allowing

_LEARNED = {"ALLOC_BUFFER": (0,), "BUFFER_GET_BASE": (0,)}  # u64 words holding heap addresses


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
        if allowed_by(allowing(allow, "death", cmd, line)):
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
        if not allowed_by(allowing(allow, "close", cmd,
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
        elif not allowed_by(allowing(allow, "answer", cmd,
                                      f"{labels[0]} {pa.hex()} / {labels[1]} {pb.hex()}")):
            first = next((k for k in range(min(len(ra), len(rb))) if ra[k] != rb[k]),
                         min(len(ra), len(rb)))
            return Divergence(
                Signature("divergence", "", f"answer differs at payload byte {first}", cmd),
                f"step {i} {cmd}: {labels[0]} {pa[:32].hex()} / {labels[1]} {pb[:32].hex()}",
                i, case.steps[i])
    return None


def dedupe_key(div: Divergence) -> tuple:
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
    digest = hashlib.sha1(repr(dedupe_key(div)).encode()).hexdigest()[:8]
    return f"divergence-{slug(div.signature.command)}-{digest}"
