"""``rpc_tensor``: the 296-byte packed tensor record (spec 3.1) and the server's size rules."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field, replace

from . import ggml
from .wire import U64_MAX


# id, type, buffer, ne[4], nb[4], op, op_params[16], flags, src[10], view_src, view_offs, data,
# name[64], use_count (a padding word up to proto 5).
TENSOR_STRUCT = struct.Struct("<QIQ4I4II16ii10QQQQ64si")
TENSOR_SIZE = TENSOR_STRUCT.size
assert TENSOR_SIZE == 296

# Field offsets inside the record, used by error reports and field mutation.
TENSOR_FIELD_OFFSETS = {
    "id": 0, "type": 8, "buffer": 12, "ne": 20, "nb": 36, "op": 52, "op_params": 56,
    "flags": 120, "src": 124, "view_src": 204, "view_offs": 212, "data": 220, "name": 228,
    "use_count": 292,
}

_ZERO4 = (0, 0, 0, 0)
_ZERO10 = (0,) * 10
_ZERO16 = (0,) * 16
_NAME0 = bytes(64)


@dataclass(frozen=True, slots=True)
class RpcTensor:
    id: int = 0
    type: int = 0
    buffer: int = 0
    ne: tuple[int, int, int, int] = (1, 1, 1, 1)
    nb: tuple[int, int, int, int] = _ZERO4
    op: int = 0
    op_params: tuple[int, ...] = _ZERO16
    flags: int = 0
    src: tuple[int, ...] = _ZERO10
    view_src: int = 0
    view_offs: int = 0
    data: int = 0
    name: bytes = field(default=_NAME0)  # raw 64 bytes, kept verbatim for byte-exact round trips
    use_count: int = 0

    def pack(self) -> bytes:
        return TENSOR_STRUCT.pack(
            self.id, self.type, self.buffer, *self.ne, *self.nb, self.op, *self.op_params,
            self.flags, *self.src, self.view_src, self.view_offs, self.data,
            self.name, self.use_count)

    @classmethod
    def unpack_from(cls, buf, offset: int = 0) -> "RpcTensor":
        v = TENSOR_STRUCT.unpack_from(buf, offset)
        return cls(v[0], v[1], v[2], v[3:7], v[7:11], v[11], v[12:28], v[28], v[29:39],
                   v[39], v[40], v[41], v[42], v[43])

    @classmethod
    def null(cls) -> "RpcTensor":
        """A null ggml_tensor* serialises as 296 zero bytes."""
        return cls(ne=_ZERO4)

    @property
    def name_str(self) -> str:
        return self.name.split(b"\0", 1)[0].decode("utf-8", "replace")

    def with_(self, **changes) -> "RpcTensor":
        return replace(self, **changes)

    @classmethod
    def make(cls, *, id: int, type: int = ggml.TYPE_F32, ne=(1, 1, 1, 1), buffer: int = 0,
             data: int = 0, name: str | bytes = b"", nb=None, op: int = 0, op_params=None,
             flags: int = 0, src=(), view_src: int = 0, view_offs: int = 0,
             use_count: int = 0) -> "RpcTensor":
        """Build a record the way the C client serialises a tensor (zeroed, NUL-terminated name)."""
        ne = tuple(ne) + (1,) * (4 - len(ne))
        if nb is None:
            nb = ggml.contiguous_strides(type, ne)
        raw = name.encode() if isinstance(name, str) else bytes(name)
        raw = raw[:ggml.MAX_NAME - 1]
        params = tuple(op_params or ())
        return cls(id=id, type=type, buffer=buffer, ne=ne, nb=tuple(nb), op=op,
                   op_params=params + (0,) * (16 - len(params)), flags=flags,
                   src=tuple(src) + (0,) * (10 - len(src)), view_src=view_src,
                   view_offs=view_offs, data=data, name=raw + bytes(64 - len(raw)),
                   use_count=use_count)




def nbytes(t: RpcTensor) -> int:
    """ggml_nbytes() of a deserialised tensor, in wrapping u64 arithmetic (spec 3.3).

    Only meaningful for a valid type; callers check the type first.
    """
    traits = ggml.TYPES[t.type]
    if any(n <= 0 for n in t.ne):  # ne are u32 on the wire, so only 0 counts here
        return 0
    if traits.blck_size == 1:
        total = traits.type_size
        for i in range(4):
            total += (t.ne[i] - 1) * t.nb[i]
    else:
        total = t.ne[0] * t.nb[0] // traits.blck_size
        for i in range(1, 4):
            total += (t.ne[i] - 1) * t.nb[i]
    return total & U64_MAX


def element_extent(t: RpcTensor, numbering) -> int | None:
    """Bytes a kernel walking ``t``'s elements by its strides touches, exactly (unbounded:
    ggml_nbytes wraps in size_t, so a shape can pass a buffer check and still reach past every
    buffer); None for a type without a block size in ``numbering``."""
    tr = numbering.type_traits(t.type)
    if tr is None or not tr.blck_size:
        return None
    if any(n <= 0 for n in t.ne):
        return 0
    if tr.blck_size == 1:
        return tr.type_size + sum((t.ne[i] - 1) * t.nb[i] for i in range(4))
    return t.ne[0] * t.nb[0] // tr.blck_size + sum((t.ne[i] - 1) * t.nb[i] for i in range(1, 4))


def element_count(t: RpcTensor) -> int:
    return t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]
