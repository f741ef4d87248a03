"""Transcripts to pcap files and back.

``write_pcap`` turns a recorded connection into a TCP conversation Wireshark accepts: a
three-way handshake, data segments of at most 65 000 bytes (so IP total length fits in 16
bits with headers) with consistent seq/ack numbers, and FIN or RST as the transcript says.
Elided chunks (bytes not kept) become header-only records whose pcap ``wirelen`` is the real
length, exactly like a capture taken with a small snap length.

``read_pcap`` goes the other way for any capture of ggml-rpc traffic (ours, tcpdump's,
Wireshark's): it splits packets into TCP conversations and reassembles each direction by
sequence number, dropping retransmitted bytes and putting out-of-order segments in place.
Scapy reads and writes the file container (pcap, and pcapng on reading); the link/IP/TCP
headers are packed and parsed with ``struct`` because scapy's generic build and dissection
are orders of magnitude slower on large captures (and dissection would run any ggml-rpc
layers bound with ``bind_port``). The scapy view of a capture is ``scapy_layer``'s job.
"""

from __future__ import annotations

import heapq
import socket
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
from scapy.packet import Packet
from scapy.utils import RawPcapReader, RawPcapWriter

from . import compressed
from .transcript import C2S, S2C, Chunk, Transcript

MAX_SEGMENT = 65_000
DEFAULT_CLIENT = ("127.0.0.1", 40_000)
DEFAULT_SERVER = ("127.0.0.1", 50_052)
DLT_EN10MB = 1
_U32 = 1 << 32

# TCP flag bits
FIN, SYN, RST, PSH, ACK = 0x01, 0x02, 0x04, 0x08, 0x10


# ---------------------------------------------------------------- writing

def _endpoints(tr: Transcript, client, server) -> tuple[tuple[str, int], tuple[str, int]]:
    meta = tr.meta or {}
    client = client or tuple(meta.get("client") or DEFAULT_CLIENT)
    server = server or tuple(meta.get("server") or meta.get("upstream") or DEFAULT_SERVER)
    return (str(client[0]), int(client[1])), (str(server[0]), int(server[1]))


@dataclass
class _Side:
    addr: tuple[str, int]
    seq: int  # next sequence number this side sends
    ip_id: int = 0


def inet_checksum(data: bytes) -> int:
    """RFC 1071 ones'-complement sum (numpy: a Python loop would dominate large pcaps)."""
    if len(data) % 2:
        data += b"\0"
    total = int(np.frombuffer(data, dtype=">u2").sum(dtype=np.uint64))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


_ETHER_IPV4 = bytes(12) + b"\x08\x00"  # all-zero MACs, as on Linux loopback captures
_MSS_OPTION = struct.pack("!BBH", 2, 4, 65495)  # the loopback MSS


class _ConversationWriter:
    """Emits the link-layer frames of one synthetic TCP conversation (Ethernet, IPv4, TCP).

    Headers are packed with ``struct`` rather than built as scapy layers: scapy's generic
    build costs ~0.5 ms per packet, which made gigabyte transcripts take many seconds.
    """

    def __init__(self, client: tuple[str, int], server: tuple[str, int], isn: tuple[int, int]):
        self.sides = {C2S: _Side(client, isn[0] % _U32), S2C: _Side(server, isn[1] % _U32)}
        self.ip = {d: socket.inet_aton(side.addr[0]) for d, side in self.sides.items()}

    def frame(self, direction: str, flags: int, payload: bytes = b"",
              payload_len: int | None = None, options: bytes = b"") -> tuple[bytes, int]:
        """(captured bytes, wire length); ``payload_len`` > len(payload) means elided bytes."""
        me = self.sides[direction]
        other = S2C if direction == C2S else C2S
        peer = self.sides[other]
        n = len(payload) if payload_len is None else payload_len
        elided = n != len(payload)
        tcp_len = 20 + len(options)
        tcp = struct.pack("!HHIIBBHHH", me.addr[1], peer.addr[1], me.seq,
                          peer.seq if flags & ACK else 0, (tcp_len // 4) << 4, flags, 65535, 0, 0)
        tcp += options
        if not elided:  # an elided segment's checksum cannot be computed: 0 = not computed
            pseudo = self.ip[direction] + self.ip[other] + struct.pack("!BBH", 0, 6, tcp_len + n)
            csum = inet_checksum(pseudo + tcp + payload)
            tcp = tcp[:16] + struct.pack("!H", csum) + tcp[18:]
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + tcp_len + n, me.ip_id, 0x4000, 64, 6, 0,
                         self.ip[direction], self.ip[other])
        ip = ip[:10] + struct.pack("!H", inet_checksum(ip)) + ip[12:]
        me.ip_id = (me.ip_id + 1) & 0xFFFF
        me.seq = (me.seq + n + (1 if flags & (SYN | FIN) else 0)) % _U32
        raw = _ETHER_IPV4 + ip + tcp + (b"" if elided else payload)
        return raw, len(raw) + (n if elided else 0)


def transcript_frames(tr: Transcript, *, client=None, server=None, max_segment: int = MAX_SEGMENT,
                      isn: tuple[int, int] = (1_000_000, 2_000_000)
                      ) -> Iterator[tuple[float, bytes, int]]:
    """Yield ``(time, captured bytes, wire length)`` for every frame of the conversation."""
    if max_segment < 1 or max_segment > MAX_SEGMENT:
        raise ValueError(f"max_segment must be in 1..{MAX_SEGMENT}")
    client, server = _endpoints(tr, client, server)
    w = _ConversationWriter(client, server, isn)
    t_open = tr.meta.get("t_open") if tr.meta else None
    if t_open is None:
        t_open = tr.chunks[0].t if tr.chunks else min((v[0] for v in tr.closed.values()), default=0.0)
    yield (t_open, *w.frame(C2S, SYN, options=_MSS_OPTION))
    yield (t_open, *w.frame(S2C, SYN | ACK, options=_MSS_OPTION))
    yield (t_open, *w.frame(C2S, ACK))
    closes = sorted((v[0], d, v[1]) for d, v in tr.closed.items())
    reset = False
    for c in tr.chunks:
        while closes and closes[0][0] < c.t:  # a half-close before later data of the other side
            t, d, how = closes.pop(0)
            yield from _close(w, t, d, how)
            reset |= how == "rst"
        if reset:
            break  # nothing travels after an RST
        for off in range(0, c.length, max_segment):
            n = min(max_segment, c.length - off)
            if c.data is None:
                yield (c.t, *w.frame(c.direction, PSH | ACK, b"", n))
            else:
                yield (c.t, *w.frame(c.direction, PSH | ACK, c.data[off:off + n]))
    for t, d, how in closes:
        if reset:
            break
        yield from _close(w, t, d, how)
        reset |= how == "rst"


def _close(w: _ConversationWriter, t: float, direction: str, how: str):
    other = S2C if direction == C2S else C2S
    if how == "rst":
        yield (t, *w.frame(direction, RST | ACK))
    else:
        yield (t, *w.frame(direction, FIN | ACK))
        yield (t, *w.frame(other, ACK))


def write_pcap(transcripts: Transcript | Iterable[Transcript], path: str | Path, *,
               client: tuple[str, int] | None = None, server: tuple[str, int] | None = None,
               max_segment: int = MAX_SEGMENT, compress: bool = False) -> int:
    """Write one or more connections to a pcap (Ethernet, microsecond stamps); returns frames.
    ``compress`` writes it gzip-compressed (Wireshark, tshark and scapy read that as is).

    Endpoints default to ``meta["client"]`` / ``meta["server"]`` of each transcript, else
    127.0.0.1:40000 -> 127.0.0.1:50052; several transcripts get consecutive client ports.
    """
    if isinstance(transcripts, Transcript):
        transcripts = [transcripts]
    streams = []
    for i, tr in enumerate(transcripts):
        c = client
        if c is None and not (tr.meta or {}).get("client"):
            c = (DEFAULT_CLIENT[0], DEFAULT_CLIENT[1] + i)
        streams.append(transcript_frames(tr, client=c, server=server, max_segment=max_segment))
    # interleave connections by time; each connection keeps its own (authoritative) order
    frames = heapq.merge(*streams, key=lambda f: f[0])
    count = 0
    # snaplen must cover a full segment: Ethernet + IP + TCP (with options) + 65 000 bytes
    with compressed.open_write(path, compress=compress) as out, \
            RawPcapWriter(out, linktype=DLT_EN10MB, snaplen=262_144) as wr:
        wr.write_header(None)  # write_packet does not write it by itself
        for t, raw, wirelen in frames:
            sec = int(t)
            usec = min(int(round((t - sec) * 1_000_000)), 999_999)
            wr.write_packet(raw, sec=sec, usec=usec, caplen=len(raw), wirelen=wirelen)
            count += 1
    return count


# ---------------------------------------------------------------- reading

@dataclass
class Segment:
    """One TCP segment: what the conversation reassembler needs, nothing else."""

    index: int  # position in the capture (tie-breaker for equal timestamps)
    t: float
    src: tuple[str, int]
    dst: tuple[str, int]
    seq: int
    flags: int
    length: int  # TCP payload length on the wire
    data: bytes | None  # None when the capture did not keep every payload byte


def parse_frame(linktype: int, raw: bytes) -> tuple | None:
    """(src, dst, seq, flags, length, data or None) of a TCP segment, None for anything else."""
    off = _link_offset(linktype, raw)
    if off is None or len(raw) < off + 20:
        return None
    ver = raw[off] >> 4
    if ver == 4:
        ihl = (raw[off] & 0x0F) * 4
        total = struct.unpack_from("!H", raw, off + 2)[0]
        if raw[off + 9] != 6 or struct.unpack_from("!H", raw, off + 6)[0] & 0x1FFF:
            return None  # not TCP, or a non-first fragment
        src_ip = ".".join(str(b) for b in raw[off + 12:off + 16])
        dst_ip = ".".join(str(b) for b in raw[off + 16:off + 20])
        tcp_off, end = off + ihl, off + total
    elif ver == 6:
        if len(raw) < off + 40 or raw[off + 6] != 6:
            return None  # extension headers are not followed
        import ipaddress

        src_ip = str(ipaddress.IPv6Address(raw[off + 8:off + 24]))
        dst_ip = str(ipaddress.IPv6Address(raw[off + 24:off + 40]))
        tcp_off = off + 40
        end = tcp_off + struct.unpack_from("!H", raw, off + 4)[0]
    else:
        return None
    if len(raw) < tcp_off + 20:
        return None
    sport, dport, seq = struct.unpack_from("!HHI", raw, tcp_off)
    data_off = (raw[tcp_off + 12] >> 4) * 4
    flags = raw[tcp_off + 13]
    start = tcp_off + data_off
    length = max(end - start, 0)
    data = raw[start:end] if len(raw) >= end else None  # trailing link padding is not payload
    return (src_ip, sport), (dst_ip, dport), seq, flags, length, data


def _link_offset(linktype: int, raw: bytes) -> int | None:
    if linktype == DLT_EN10MB:
        off, ethertype = 14, struct.unpack_from("!H", raw, 12)[0] if len(raw) >= 14 else 0
        while ethertype in (0x8100, 0x88A8) and len(raw) >= off + 4:  # VLAN tags
            ethertype = struct.unpack_from("!H", raw, off + 2)[0]
            off += 4
        return off if ethertype in (0x0800, 0x86DD) else None
    if linktype in (0, 108):  # BSD loopback: 4-byte address family
        return 4
    if linktype in (12, 14, 101, 228, 229):  # raw IP
        return 0
    if linktype == 113:  # Linux cooked capture v1
        return 16
    if linktype == 276:  # Linux cooked capture v2
        return 20
    return None


def _pcap_records(path: str | Path) -> Iterator[tuple[int, float, bytes]]:
    """(linktype, time, captured bytes) of every record of a pcap or pcapng file."""
    reader = RawPcapReader(str(path))
    try:
        while True:
            try:
                # a large size so TSO/GRO segments up to 64 KiB (+ headers) are not cut
                raw, meta = reader._read_packet(size=1 << 18)
            except EOFError:
                return
            if hasattr(meta, "tsresol"):  # pcapng
                t = ((meta.tshigh << 32) | meta.tslow) / meta.tsresol
                yield meta.linktype, t, raw
            else:
                scale = 1e-9 if getattr(reader, "nano", False) else 1e-6
                yield reader.linktype, meta.sec + meta.usec * scale, raw
    finally:
        reader.close()


def _packet_records(packets: Iterable[Packet]) -> Iterator[tuple[int, float, bytes]]:
    from scapy.config import conf

    for p in packets:
        linktype = conf.l2types.layer2num.get(type(p), DLT_EN10MB)
        # bytes(p), not p.original: packets edited after reading must count as edited
        yield linktype, float(p.time), bytes(p)


def _segments(records: Iterable[tuple[int, float, bytes]]) -> Iterator[Segment]:
    for i, (linktype, t, raw) in enumerate(records):
        parsed = parse_frame(linktype, raw)
        if parsed is not None:
            src, dst, seq, flags, length, data = parsed
            yield Segment(i, t, src, dst, seq, flags, length, data)


@dataclass
class _Direction:
    segments: list[Segment] = field(default_factory=list)
    isn: int | None = None  # sequence number of the first payload byte, from the SYN
    close: tuple[float, int, str] | None = None  # (time, capture index, "fin" | "rst")


def _conversations(segments: Iterable[Segment], server_port: int | None):
    """Group segments by connection; returns [(client, server, {C2S: dir, S2C: dir}, t_open)]."""
    convs: list[dict] = []
    current: dict[tuple, dict] = {}  # 4-tuple -> its latest conversation (ports get reused)
    for s in segments:
        key = tuple(sorted((s.src, s.dst)))
        conv = current.get(key)
        fresh_syn = s.flags & SYN and not s.flags & ACK
        if conv is None or (fresh_syn and conv["closed"]):
            conv = current[key] = {"key": key, "dirs": {s.src: _Direction(), s.dst: _Direction()},
                                   "client": None, "t_open": s.t, "closed": False}
            convs.append(conv)
        d = conv["dirs"][s.src]
        if s.flags & SYN:
            d.isn = (s.seq + 1) % _U32
            if fresh_syn:
                conv["client"] = s.src
            continue
        if s.flags & (FIN | RST):
            conv["closed"] = True
            if d.close is None:
                d.close = (s.t, s.index, "rst" if s.flags & RST else "fin")
        if s.length:
            d.segments.append(s)
    out = []
    for conv in convs:
        a, b = conv["key"]
        client = conv["client"] or _guess_client(a, b, conv["dirs"], server_port)
        server = b if client == a else a
        out.append((client, server, {C2S: conv["dirs"][client], S2C: conv["dirs"][server]},
                    conv["t_open"]))
    return out


def _guess_client(a, b, dirs: dict, server_port: int | None):
    """No SYN in the capture: the given server port, else ggml-rpc's default port, else the
    side that sent payload first (the client always speaks first), else the higher port."""
    for port in (server_port, DEFAULT_SERVER[1]):
        if port is not None and port in (a[1], b[1]) and a[1] != b[1]:
            return b if a[1] == port else a
    first = {side: min((s.index for s in d.segments), default=None) for side, d in dirs.items()}
    if first[a] is not None and (first[b] is None or first[a] < first[b]):
        return a
    if first[b] is not None:
        return b
    return a if a[1] > b[1] else b


def _reassemble(d: _Direction) -> list[tuple[int, Chunk]]:
    """In-order chunks of one direction, each with the capture index it became readable at.

    Bytes are placed by sequence number relative to the first byte; already-delivered bytes
    (retransmits) are dropped; a hole the capture never filled becomes an elided chunk.
    """
    if not d.segments:
        return []
    base = d.isn if d.isn is not None else d.segments[0].seq
    # Unwrap 32-bit sequence numbers (streams beyond 4 GiB): in capture order, each segment
    # lies within 2 GiB of the furthest byte seen so far. Before ``base`` is negative (no SYN).
    placed, furthest = [], 0
    for s in d.segments:
        r = (s.seq - base) % _U32
        start = r + (furthest - r + _U32 // 2) // _U32 * _U32
        placed.append((start, s))
        furthest = max(furthest, start + s.length)
    chunks: list[tuple[int, Chunk]] = []
    nxt, ready = 0, 0
    for start, s in sorted(placed, key=lambda p: (p[0], p[1].index)):
        end = start + s.length
        if end <= nxt:
            continue  # retransmission of delivered bytes
        if start > nxt:  # bytes never captured
            chunks.append((ready, Chunk(s.t, "", start - nxt, None)))
            nxt = start
        skip = nxt - start
        data = s.data[skip:] if s.data is not None else None
        # data becomes readable only once everything before it has arrived
        ready = max(ready, s.index)
        chunks.append((ready, Chunk(s.t, "", end - nxt, data)))
        nxt = end
    return chunks


def _merge(chunks: list[tuple[int, Chunk]], direction: str) -> list[tuple[int, Chunk]]:
    """Join consecutive segments of one send (same time, both kept or both elided)."""
    groups: list[tuple[int, list[Chunk]]] = []
    for ready, c in chunks:
        if groups:
            pr, g = groups[-1]
            if g[0].t == c.t and (g[0].data is None) == (c.data is None):
                g.append(c)
                groups[-1] = (max(pr, ready), g)
                continue
        groups.append((ready, [c]))
    out = []
    for ready, g in groups:
        data = None if g[0].data is None else b"".join(c.data for c in g)
        out.append((ready, Chunk(g[0].t, direction, sum(c.length for c in g), data)))
    return out


def _transcripts(records: Iterable[tuple[int, float, bytes]],
                 server_port: int | None) -> list[Transcript]:
    result = []
    for client, server, dirs, t_open in _conversations(_segments(records), server_port):
        c2s = _merge(_reassemble(dirs[C2S]), C2S)
        s2c = _merge(_reassemble(dirs[S2C]), S2C)
        both = sorted(c2s + s2c, key=lambda rc: rc[0])  # stable: keeps each direction's order
        tr = Transcript(keep=1 << 62, meta={"client": list(client), "server": list(server),
                                            "t_open": t_open})
        tr.chunks = [c for _, c in both]
        for direction in (C2S, S2C):
            close = dirs[direction].close
            if close is not None:
                tr.close(close[0], direction, close[2])
        result.append(tr)
    return result


def read_pcap(path: str | Path, *, server_port: int | None = None) -> list[Transcript]:
    """One transcript per TCP conversation in the capture, in order of first appearance.

    The client is the side that sent the SYN; without a handshake in the capture it is the
    side not using ``server_port`` (default 50052), else the side that spoke first.
    """
    return _transcripts(_pcap_records(path), server_port)


def transcripts_from_packets(packets: Iterable[Packet], *,
                             server_port: int | None = None) -> list[Transcript]:
    """Like ``read_pcap`` for scapy packets already in memory (e.g. from ``rdpcap``)."""
    return _transcripts(_packet_records(packets), server_port)
