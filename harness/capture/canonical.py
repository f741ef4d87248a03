"""Canonical transcripts and their differences.

Two sessions of the same scenario never match byte for byte: tensor ids are client pointers,
buffer handles and data addresses are server pointers, and timing differs. Canonicalising
renames every such value symbolically, in order of first appearance (tensors T1, T2, ...;
buffers B1, ...; addresses as B1+0x40 relative to the buffer they fall in; graph uids G1, ...,
which are client counters), drops timing and
replaces bulk data by its length and FNV-1a. What is left is what both sides *said*, so two
canonical sessions can be compared message by message and field by field.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields
from typing import Any

from ..proto import Cmd, Session
from ..proto.fnv import fnv1a64
from ..proto.messages import Message
from ..proto.tensor import RpcTensor

# Fields holding server pointers (buffer handles, addresses) and client pointers (tensor ids).
HANDLE_FIELDS = {"remote_ptr", "buffer"}
ADDRESS_FIELDS = {"base_ptr", "data"}
TENSOR_ID_FIELDS = {"id", "view_src"}
DATA_FIELDS = {"data"}  # when bytes


@dataclass
class _Namer:
    tensors: dict[int, str] = field(default_factory=dict)
    buffers: dict[int, str] = field(default_factory=dict)
    bases: dict[str, int] = field(default_factory=dict)  # buffer symbol -> base address
    sizes: dict[str, int] = field(default_factory=dict)
    addresses: dict[int, str] = field(default_factory=dict)
    uids: dict[int, str] = field(default_factory=dict)

    def uid(self, v: int) -> str | int:
        if not v:  # uid 0 means "not set": the value itself is what both sides agree on
            return 0
        return self.uids.setdefault(v, f"G{len(self.uids) + 1}")

    def tensor(self, v: int) -> str | int:
        if not v:
            return 0
        return self.tensors.setdefault(v, f"T{len(self.tensors) + 1}")

    buffers_named: int = 0

    def buffer(self, v: int) -> str | int:
        if not v:
            return 0
        if v not in self.buffers:
            self.buffers_named += 1
            self.buffers[v] = f"B{self.buffers_named}"
        return self.buffers[v]

    def retire_buffer(self, v: int) -> None:
        """FREE_BUFFER: the handle (and its memory) may come back from the server's allocator
        for another buffer, which is a new buffer and gets a new name."""
        sym = self.buffers.pop(v, None)
        if sym is not None:
            self.bases.pop(sym, None)
            self.sizes.pop(sym, None)

    def address(self, v: int) -> str | int:
        if not v:
            return 0
        for sym, base in self.bases.items():
            if base <= v <= base + self.sizes.get(sym, 0):
                off = v - base
                return f"{sym}+0x{off:x}" if off else sym
        return self.addresses.setdefault(v, f"A{len(self.addresses) + 1}")


def _tensor(t: RpcTensor, n: _Namer) -> dict:
    return {
        "id": n.tensor(t.id), "type": t.type, "buffer": n.buffer(t.buffer), "ne": list(t.ne),
        "nb": list(t.nb), "op": t.op, "op_params": list(t.op_params), "flags": t.flags,
        "src": [n.tensor(s) for s in t.src], "view_src": n.tensor(t.view_src),
        "view_offs": t.view_offs, "data": n.address(t.data), "name": t.name_str,
        "use_count": t.use_count,
    }


def _value(name: str, v: Any, n: _Namer) -> Any:
    if isinstance(v, RpcTensor):
        return _tensor(v, n)
    if isinstance(v, tuple) and v and isinstance(v[0], RpcTensor):
        return [_tensor(t, n) for t in v]
    if isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)
        return b.hex() if len(b) <= 32 and name != "data" else {"len": len(b),
                                                                "fnv": f"{fnv1a64(b):016x}"}
    if name in HANDLE_FIELDS and isinstance(v, int):
        return n.buffer(v)
    if name in ADDRESS_FIELDS and isinstance(v, int):
        return n.address(v)
    if name == "nodes":
        return [n.tensor(x) for x in v]
    if name == "uid" and isinstance(v, int):
        return n.uid(v)
    if isinstance(v, tuple):
        return list(v)
    return v


def _message(msg: Message | None, n: _Namer) -> dict | None:
    if msg is None:
        return None
    return {f.name: _value(f.name, getattr(msg, f.name), n) for f in fields(msg)
            if f.name != "cmd_name"}


def canonical(session: Session) -> list[dict]:
    """One dict per exchange: command, canonical request, canonical response."""
    n = _Namer()
    out = []
    for ex in session.exchanges:
        if ex.request is None:
            continue
        req = _message(ex.request, n)
        rsp = _message(ex.response, n)
        if ex.cmd is Cmd.ALLOC_BUFFER and ex.response is not None and rsp:
            n.sizes[rsp["remote_ptr"]] = ex.response.remote_size
        if ex.cmd is Cmd.BUFFER_GET_BASE and ex.response is not None and ex.response.base_ptr:
            sym = req["remote_ptr"]
            n.bases[sym] = ex.response.base_ptr
            rsp = {"base_ptr": sym}
        if ex.cmd is Cmd.FREE_BUFFER:
            n.retire_buffer(ex.request.remote_ptr)
        item = {"cmd": ex.cmd.value, "request": req}
        if ex.expects_response:
            item["response"] = rsp
        if ex.data_length and ex.data_hash:
            item["data"] = {"len": ex.data_length, "fnv": ex.data_hash}
        out.append(item)
    return out


@dataclass
class WireDivergence:
    index: int  # exchange index in both canonical sessions
    cmd: str | None
    path: str  # e.g. "request.tensor.nb[1]"
    a: Any
    b: Any

    def __str__(self) -> str:
        return f"exchange {self.index} ({self.cmd}): {self.path}: {self.a!r} != {self.b!r}"


def _first_difference(a: Any, b: Any, path: str) -> tuple[str, Any, Any] | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            d = _first_difference(a.get(k), b.get(k), f"{path}.{k}" if path else k)
            if d:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i in range(max(len(a), len(b))):
            d = _first_difference(a[i] if i < len(a) else None, b[i] if i < len(b) else None,
                                  f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else (path, a, b)


def first_divergence(a: list[dict], b: list[dict]) -> WireDivergence | None:
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else None
        y = b[i] if i < len(b) else None
        if x is None or y is None:
            present = x or y
            return WireDivergence(i, present["cmd"], "(exchange)",
                              x["cmd"] if x else "(missing)", y["cmd"] if y else "(missing)")
        d = _first_difference(x, y, "")
        if d:
            return WireDivergence(i, x["cmd"], *d)
    return None


def render(c: list[dict]) -> list[str]:
    """Line-per-exchange text of a canonical session, for unified diffs."""
    import json
    return [f"{i:3d} {e['cmd']:<16} {json.dumps({k: v for k, v in e.items() if k != 'cmd'}, sort_keys=True)}"
            for i, e in enumerate(c)]


def unified_diff(a: list[dict], b: list[dict], a_name: str = "a", b_name: str = "b") -> list[str]:
    return list(difflib.unified_diff(render(a), render(b), a_name, b_name, lineterm="", n=1))


def command_differences(a: list[dict], b: list[dict]) -> list[str]:
    """Commands present in one session and not the other, aligned on the command sequence."""
    ca, cb = [e["cmd"] for e in a], [e["cmd"] for e in b]
    out = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=ca, b=cb, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        if i2 > i1:
            out.append(f"only in a at {i1}..{i2 - 1}: {', '.join(ca[i1:i2])}")
        if j2 > j1:
            out.append(f"only in b at {j1}..{j2 - 1}: {', '.join(cb[j1:j2])}")
    return out
