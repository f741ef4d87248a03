"""HELLO ``conn_caps``: how each side offers RDMA and when it switches (spec 10.1).

Both HELLO directions carry 24 bytes. Linux layout: ``qpn u32 @0, psn u32 @4 (= qpn &
0xFFFFFF), gid[16] @8``; macOS layout: ``qpn u32 @0, lid u16 @4, reserved u16 @6, gid[16] @8``.
A side treats the peer as RDMA-capable iff any of the 24 bytes is non-zero, and activates iff
its own probe succeeded and the peer's caps are non-zero. Linux has no confirmation exchange,
so the two decisions are independent: one side can switch while the other stays on TCP, and
then no RPC byte gets through (spec 10.4).

The order is fixed: the server sends its HELLO response over TCP and then activates with the
client's caps; the client reads the response, checks the version, then activates with the
server's caps. A client that rejects the version never activates.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

from ..proto.constants import CONN_CAPS_SIZE

LINUX, MACOS = "linux", "macos"
PLATFORMS = (LINUX, MACOS)

_LINUX = struct.Struct("<II16s")
_MACOS = struct.Struct("<IHH16s")
PSN_MASK = 0xFFFFFF
MACOS_READY = 0x2A  # readiness byte macOS peers exchange over TCP after activating

ZERO_CAPS = bytes(CONN_CAPS_SIZE)

# What a side does with RDMA in the HELLO exchange. The real peers only ever ADVERTISE (probe
# succeeded) or WITHHOLD (GGML_RPC_NO_RDMA, no device, or an old build: zero caps). The other
# two are lies for the harness: they make exactly one side switch.
ADVERTISE = "advertise"  # real caps; activate when the peer's caps are non-zero
WITHHOLD = "withhold"  # zero caps; never activate
LIE_CAPABLE = "lie-capable"  # non-zero caps naming no QP, never activate: the peer switches alone
HIDE_AND_ACTIVATE = "hide-and-activate"  # zero caps, yet activate on the peer's: we switch alone
CAPS_POLICIES = (ADVERTISE, WITHHOLD, LIE_CAPABLE, HIDE_AND_ACTIVATE)


@dataclass(frozen=True)
class LinuxCaps:
    qpn: int
    psn: int
    gid: bytes

    def pack(self) -> bytes:
        return _LINUX.pack(self.qpn, self.psn, self.gid)


@dataclass(frozen=True)
class MacCaps:
    qpn: int
    lid: int
    reserved: int
    gid: bytes

    def pack(self) -> bytes:
        return _MACOS.pack(self.qpn, self.lid, self.reserved, self.gid)


def gid_for_ipv4(addr: str) -> bytes:
    """The GID a peer looks for: the TCP socket's local IPv4 address as ``::ffff:a.b.c.d``."""
    return bytes(10) + b"\xff\xff" + ipaddress.IPv4Address(addr).packed


def ipv4_of_gid(gid: bytes) -> str | None:
    """The IPv4 address of an IPv4-mapped GID, else None."""
    if len(gid) == 16 and gid[:12] == bytes(10) + b"\xff\xff":
        return str(ipaddress.IPv4Address(gid[12:]))
    return None


def pack_linux(qpn: int, gid: bytes, psn: int | None = None) -> bytes:
    return LinuxCaps(qpn, qpn & PSN_MASK if psn is None else psn, gid).pack()


def pack_macos(qpn: int, lid: int, gid: bytes) -> bytes:
    return MacCaps(qpn, lid, 0, gid).pack()


def _check_size(caps: bytes) -> None:
    if len(caps) != CONN_CAPS_SIZE:
        raise ValueError(f"conn_caps must be {CONN_CAPS_SIZE} bytes, got {len(caps)}")


def unpack_linux(caps: bytes) -> LinuxCaps:
    _check_size(caps)
    return LinuxCaps(*_LINUX.unpack(caps))


def unpack_macos(caps: bytes) -> MacCaps:
    _check_size(caps)
    return MacCaps(*_MACOS.unpack(caps))


def unpack(caps: bytes, platform: str = LINUX) -> LinuxCaps | MacCaps:
    return unpack_macos(caps) if platform == MACOS else unpack_linux(caps)


def supports_rdma(caps: bytes) -> bool:
    """The peer offers RDMA iff any of the 24 bytes is non-zero (the only test the C code makes)."""
    return any(caps)


def oddities(caps: bytes, platform: str = LINUX) -> list[str]:
    """What is odd about non-zero caps (the C peer checks none of this; for diagnostics)."""
    if not supports_rdma(caps):
        return []
    c = unpack(caps, platform)
    out = []
    if c.qpn == 0:
        out.append("qpn is 0")
    if isinstance(c, LinuxCaps) and c.psn != c.qpn & PSN_MASK:
        out.append(f"psn 0x{c.psn:x} != qpn & 0xFFFFFF (0x{c.qpn & PSN_MASK:x})")
    if ipv4_of_gid(c.gid) is None:
        out.append(f"gid {c.gid.hex()} is not IPv4-mapped")
    return out


def probe_ok(policy: str) -> bool:
    """Whether a side with this policy has (or claims internally to have) a working device."""
    _check_policy(policy)
    return policy in (ADVERTISE, HIDE_AND_ACTIVATE)


def advertised_caps(policy: str, real_caps: bytes, *, lie_caps: bytes | None = None) -> bytes:
    """The 24 bytes a side puts in its HELLO part under ``policy``."""
    _check_policy(policy)
    if policy == ADVERTISE:
        return real_caps
    if policy == LIE_CAPABLE:
        return lie_caps if lie_caps is not None else LIE_CAPS
    return ZERO_CAPS


def activates(policy: str, peer_caps: bytes) -> bool:
    """The activation rule of spec 10.1: own probe succeeded and the peer's caps are non-zero."""
    return probe_ok(policy) and supports_rdma(peer_caps)


def _check_policy(policy: str) -> None:
    if policy not in CAPS_POLICIES:
        raise ValueError(f"unknown caps policy {policy!r}; known: {', '.join(CAPS_POLICIES)}")


# Non-zero caps that name no queue pair: qpn 0xBAD0BA is far above anything the emulator hands
# out, and the GID is 127.0.0.1's.
LIE_CAPS = pack_linux(0xBAD0BA, gid_for_ipv4("127.0.0.1"))

TCP, RDMA, ASYMMETRIC = "tcp", "rdma", "asymmetric"


@dataclass(frozen=True)
class Negotiation:
    """What spec 10.1 predicts for one HELLO exchange."""

    client_caps: bytes
    server_caps: bytes
    client_activates: bool
    server_activates: bool

    @property
    def outcome(self) -> str:
        if self.client_activates and self.server_activates:
            return RDMA
        if self.client_activates or self.server_activates:
            return ASYMMETRIC
        return TCP

    @property
    def asymmetric(self) -> bool:
        return self.outcome == ASYMMETRIC

    def describe(self) -> str:
        def side(name: str, on: bool) -> str:
            return f"{name} {'switches to RDMA' if on else 'stays on TCP'}"
        text = (f"{side('server', self.server_activates)}, "
                f"{side('client', self.client_activates)}")
        if self.asymmetric:
            text += ": asymmetric activation, no RPC byte gets through until one side closes TCP"
        return text


def negotiate(client_policy: str, server_policy: str, *, client_caps: bytes | None = None,
              server_caps: bytes | None = None, client_accepts_version: bool = True,
              real_caps: bytes = pack_linux(0x000101, gid_for_ipv4("127.0.0.1"))) -> Negotiation:
    """Predict both activation decisions.

    ``client_caps`` / ``server_caps`` override what a side advertises (the Misbehaviour
    ``client_caps`` / ``hello_caps`` knobs); activation still follows the side's own policy,
    as in the C code, where it depends on the local probe and the peer's bytes only.
    """
    c_caps = client_caps if client_caps is not None else advertised_caps(client_policy, real_caps)
    s_caps = server_caps if server_caps is not None else advertised_caps(server_policy, real_caps)
    server_on = activates(server_policy, c_caps)
    client_on = client_accepts_version and activates(client_policy, s_caps)
    return Negotiation(c_caps, s_caps, client_on, server_on)
