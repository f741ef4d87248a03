"""Flag-byte mutations (``kind == "flag"``).

* ``hello_flags`` -- HELLO *response* (for client targets) announcing the dialect's version
  with byte 3 in {0x00, 0x01, 0x02, 0x80, 0xFF};
* ``server_conn_caps`` -- HELLO response whose ``conn_caps`` has exactly one non-zero byte
  (``index``/``value``): "server is RDMA capable" to a client (spec 10.1);
* ``client_conn_caps`` -- the same in the HELLO request, for server targets;
* ``cache_flag`` -- a valid SET_TENSOR with ``cache_flag`` in {0, 1, 2, 0xFF} (dialects with
  the cache flag only).
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from ..proto.codec import pack_request, pack_response
from ..proto.constants import CONN_CAPS_SIZE, Cmd
from ..proto.messages import HelloRequest, HelloResponse
from .registry import mutation

_HELLO_FLAG_BYTES = (0x00, 0x01, 0x02, 0x80, 0xFF)
_CACHE_FLAG_BYTES = (0x00, 0x01, 0x02, 0xFF)


def _hello_with_caps(d, cmd) -> bool:
    return cmd is Cmd.HELLO and d.hello_caps


def _one_hot_caps(draw) -> tuple[int, int, bytes]:
    index = draw(st.integers(0, CONN_CAPS_SIZE - 1))
    value = draw(st.sampled_from((0x01, 0x80, 0xFF)) | st.integers(1, 0xFF))
    caps = bytearray(CONN_CAPS_SIZE)
    caps[index] = value
    return index, value, bytes(caps)


def _hello_response(d, **fields) -> HelloResponse:
    major, minor, patch = d.version
    return HelloResponse(major=major, minor=minor, patch=patch, **fields)


@mutation("flag", "hello_flags", fields=("flags",), applies=_hello_with_caps,
          direction="response")
def _(draw, site):
    value = draw(st.sampled_from(_HELLO_FLAG_BYTES))
    return site.mutation("flags", pack_response(site.d, _hello_response(site.d, flags=value)),
                         value=value)


@mutation("flag", "server_conn_caps", fields=("conn_caps",), applies=_hello_with_caps,
          direction="response")
def _(draw, site):
    index, value, caps = _one_hot_caps(draw)
    data = pack_response(site.d, _hello_response(site.d, conn_caps=caps))
    return site.mutation("conn_caps", data, value=value, index=index)


@mutation("flag", "client_conn_caps", fields=("conn_caps",), applies=_hello_with_caps,
          opening=True)
def _(draw, site):
    index, value, caps = _one_hot_caps(draw)
    return site.mutation("conn_caps", pack_request(site.d, HelloRequest(conn_caps=caps)),
                         value=value, index=index)


@mutation("flag", "cache_flag", fields=("cache_flag",),
          applies=lambda d, c: c is Cmd.SET_TENSOR and d.cache_flag)
def _(draw, site):
    value = draw(st.sampled_from(_CACHE_FLAG_BYTES))
    return site.mutation("cache_flag", replace(site.request, cache_flag=value), value=value)
