"""A cell's labels against the wire: each side must speak the dialect matrix.yaml says it does.

The server's label is checked from its HELLO answer (version, flags byte); the client's from
what it sends: its HELLO layout, whether its whole stream parses as its dialect (command ids
and message layouts), and whether it hashes weights the way its dialect's clients do. A
mismatch makes the cell an error ("misconfigured"), not an incompatibility.
"""

from __future__ import annotations


from ..proto.wire import REQUEST_HEAD
from ..capture.transcript import C2S, Transcript
from ..reference.behaviour_view import HASH_ALWAYS, HASH_IF_FLAG, behaviour_view_for
from ..proto import HASH_THRESHOLD, SERVER_FLAG_CACHE, Cmd, Session, get_dialect
from ..proto.constants import CONN_CAPS_SIZE, HELLO_ID
from ..proto.tensor import nbytes



def server_label_mismatch(server_dialect: str, sessions: list[Session]) -> str | None:
    """The server's label must match what it announced in every HELLO answer."""
    expected = get_dialect(server_dialect)
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


def client_label_mismatch(client_dialect: str, transcripts: list[Transcript],
                          sessions: list[Session], *, uploads_big_weights: bool) -> str | None:
    """The client's label must match what it sent on every connection.

    ``uploads_big_weights``: the scenario's uploads above the hash threshold all go to
    weights buffers, so the hashing policy of the label applies to them.
    """
    d = get_dialect(client_dialect)
    for i, (tr, seen) in enumerate(zip(transcripts, sessions)):
        head = _first_bytes(tr, REQUEST_HEAD.size)
        if len(head) < REQUEST_HEAD.size:
            continue  # nothing (or not even a frame header) sent: no statement about a dialect
        where = f"client labelled {d.name}, connection {i}"
        cmd, caps = REQUEST_HEAD.unpack(head)
        if cmd != HELLO_ID:
            return f"{where}: opened with command byte {cmd}, not HELLO"
        want = CONN_CAPS_SIZE if d.hello_caps else 0
        if caps != want:
            return f"{where}: sent a {caps}-byte HELLO, its dialect sends {want} bytes"
        own = tr.decode(dialect=d)  # the client's bytes read as the dialect of its label
        sent = [e for e in own.exchanges if e.request is not None]
        unparsed = own.c2s_error and not _cut_short(own) and \
            not _unrecorded_before(tr, own.c2s_error_offset)
        if unparsed:
            return f"{where}: sent what {d.name} cannot parse: {own.c2s_error}"
        misfit = next((e for e in sent if e.cmd is Cmd.SET_TENSOR and not _fits(e)), None)
        if misfit is not None:
            # e.g. a cache_flag byte its label does not have shifts offset and payload by one
            return (f"{where}: sent what {d.name} cannot parse: SET_TENSOR #{misfit.index} "
                    f"writes past its tensor when read with {d.name}'s layout")
        if uploads_big_weights:
            wrong = _hashing_mismatch(d.name, sent, seen)
            if wrong:
                return f"{where}: {wrong}"
    return None


def _fits(e) -> bool:
    size = e.data_length or len(e.request.data)
    return e.request.offset + size <= nbytes(e.request.tensor)


def _first_bytes(tr: Transcript, n: int) -> bytes:
    out = b""
    for c in tr.stream(C2S):
        if c.data is None or len(out) >= n:
            break
        out += c.data
    return out[:n]


def _cut_short(session: Session) -> bool:
    """The stream ended inside a message (a client that disconnects mid-upload on purpose),
    which is no statement about its dialect."""
    return "closed inside" in (session.c2s_error or "")


def _unrecorded_before(tr: Transcript, offset: int | None) -> bool:
    """Bytes up to ``offset`` were not all recorded (a transcript that stopped keeping payload
    decodes them as zeros), so an error there says nothing about the client."""
    seen = 0
    for c in tr.stream(C2S):
        if offset is not None and seen > offset:
            return False
        if c.data is None:
            return True
        seen += c.length
    return False


def _hashing_mismatch(dialect: str, sent: list, seen: Session) -> str | None:
    policy = behaviour_view_for(dialect).client_hash
    hello = seen.server_hello
    server_cache = bool(hello and hello.flags & SERVER_FLAG_CACHE)
    should_hash = policy == HASH_ALWAYS or (policy == HASH_IF_FLAG and server_cache)
    hashes = sum(1 for e in sent if e.cmd is Cmd.SET_TENSOR_HASH)
    if not should_hash:
        if hashes:
            return (f"sent {hashes} SET_TENSOR_HASH although the server's HELLO announced no "
                    f"cache (its dialect hashes only when it does)")
        return None
    for k, e in enumerate(sent):
        big = e.cmd is Cmd.SET_TENSOR and e.data_length > HASH_THRESHOLD
        if big and (k == 0 or sent[k - 1].cmd is not Cmd.SET_TENSOR_HASH):
            why = "always" if policy == HASH_ALWAYS else "when the server has a cache"
            return (f"uploaded {e.data_length} bytes of weights without SET_TENSOR_HASH first "
                    f"(its dialect hashes uploads above {HASH_THRESHOLD} bytes {why})")
    return None
