"""Framing mutations (``kind == "framing"``) of valid request frames.

* ``len_too_small`` -- length below the exact/minimum payload size, payload cut to it;
* ``len_too_large`` -- fixed-size commands: length above the exact size, payload padded;
* ``len_huge`` -- length 2**41 .. 2**64-1 followed by the original payload;
* ``len_large`` -- variable-size commands: 1 MiB .. 1 TiB (not specified for real servers,
  spec 15.1);
* ``truncated`` -- a valid frame cut inside header or payload, then EOF (``eof: True``);
* ``trailing_garbage`` -- a valid frame followed by a partial header or an unknown command;
* ``unknown_cmd`` -- a command byte the dialect does not define (18..255 for 7.0.0);
* ``hello_missing`` -- a valid non-HELLO frame as the first bytes of the connection;
* ``hello_repeated`` -- a second HELLO.

Mutations of HELLO's own length use ``at == "connect"``.
"""

from __future__ import annotations

from hypothesis import strategies as st

from ..proto.codec import pack_request_payload
from ..proto.constants import HELLO_ID, Cmd
from ..proto.dialects import Dialect
from ..proto.messages import GraphLayout, Message, spec_for
from ..proto.wire import REQUEST_HEADER_SIZE, U64_MAX, request_frame
from .registry import mutation, request_fields

_HUGE_LENGTHS = (1 << 41, 1 << 48, 1 << 62, 1 << 63, U64_MAX)


def _min_payload(d: Dialect, msg: Message) -> int:
    """Smallest payload length the receiver accepts for this message (exact for fixed sizes)."""
    layout = spec_for(d, msg.cmd).request
    if isinstance(layout, GraphLayout):
        return len(pack_request_payload(d, msg)) - len(msg.trailing)
    return layout.fixed_size


def _is_fixed(d: Dialect, cmd: Cmd) -> bool:
    return not spec_for(d, cmd).request.variable


def _has_minimum(d: Dialect, cmd: Cmd) -> bool:
    layout = spec_for(d, cmd).request
    return isinstance(layout, GraphLayout) or layout.fixed_size > 0


# a graph's counts are read before its length is known to be short
@mutation("framing", "len_too_small", fields=("len",), applies=_has_minimum,
          refused_at=("len", "n_nodes", "n_tensors"))
def _(draw, site):
    frame = site.frame()
    n = draw(st.integers(0, _min_payload(site.d, site.request) - 1))
    return site.mutation("len", request_frame(frame[0], frame[REQUEST_HEADER_SIZE:][:n]), value=n)


@mutation("framing", "len_too_large", fields=("len",), applies=_is_fixed, refused_at=("len",))
def _(draw, site):
    frame = site.frame()
    extra = draw(st.binary(min_size=1, max_size=64))
    n = len(frame) - REQUEST_HEADER_SIZE + len(extra)
    return site.mutation("len", request_frame(frame[0], frame[REQUEST_HEADER_SIZE:] + extra),
                         value=n)


# within the reader's bound it waits for the payload
@mutation("framing", "len_large", fields=("len",), applies=lambda d, c: not _is_fixed(d, c),
          refused_at=("len",), may_wait=True)
def _(draw, site):
    frame = site.frame()
    n = draw(st.integers(1 << 20, 1 << 40))
    return site.mutation("len", request_frame(frame[0], frame[REQUEST_HEADER_SIZE:], n), value=n)


@mutation("framing", "len_huge", fields=("len",), refused_at=("len",))
def _(draw, site):
    frame = site.frame()
    n = draw(st.sampled_from(_HUGE_LENGTHS))
    return site.mutation("len", request_frame(frame[0], frame[REQUEST_HEADER_SIZE:], n), value=n)


# A request with an empty payload (DEVICE_COUNT) can only be cut inside its header: listing
# "payload" for it would claim a field no draw can write (never exercised, by construction).
@mutation("framing", "truncated",
          fields=lambda d, c: ("len", "payload") if request_fields(d, c) else ("len",),
          refused_at=("len", "payload"))
def _(draw, site):
    frame = site.frame()
    cut = draw(st.integers(1, len(frame) - 1))
    field = "len" if cut < REQUEST_HEADER_SIZE else "payload"
    return site.mutation(field, frame[:cut], value=cut, eof=True)


# a partial header waits for the rest
@mutation("framing", "trailing_garbage", fields=("frame",), refused_at=("cmd",), may_wait=True)
def _(draw, site):
    # Garbage that cannot complete a frame: a bare partial header, or an unknown command.
    frame, d = site.frame(), site.d
    known = sorted(i for i in d.ids if i != HELLO_ID)
    unknown = [i for i in range(256) if i not in d.ids]
    partial = st.builds(lambda c, rest: bytes([c]) + rest, st.sampled_from(known),
                        st.binary(max_size=REQUEST_HEADER_SIZE - 2))
    foreign = st.builds(lambda c, rest: bytes([c]) + rest, st.sampled_from(unknown),
                        st.binary(max_size=32))
    garbage = draw(st.one_of(partial, foreign))
    return site.mutation("frame", frame + garbage, value=len(garbage))


@mutation("framing", "hello_missing", fields=("cmd",), applies=lambda d, c: c is not Cmd.HELLO,
          refused_at=("cmd",))
def _(draw, site):
    return site.mutation("cmd", site.frame(), at="connect")


@mutation("framing", "hello_repeated", fields=("cmd",), applies=lambda d, c: c is Cmd.HELLO,
          refused_at=("cmd",))
def _(draw, site):
    return site.mutation("cmd", site.frame(), at="after_hello")


@mutation("framing", "unknown_cmd", fields=("cmd",), unknown_cmd=True, refused_at=("cmd",))
def _(draw, site):
    unknown = [i for i in range(256) if i not in site.d.ids]
    interesting = [i for i in (18, 19, 20, 21, 22, 23, 24, 127, 128, 255) if i in unknown]
    cid = draw(st.one_of(st.sampled_from(interesting), st.sampled_from(unknown)))
    payload = draw(st.binary(max_size=16))
    return site.mutation("cmd", request_frame(cid, payload), cmd_id=cid,
                         at="after_hello", value=cid)
