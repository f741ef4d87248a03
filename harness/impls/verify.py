"""Is a server what it claims to be? Its HELLO answer (packed and parsed by harness.proto) and
its banner, read from a short-lived run of it."""

from __future__ import annotations

import socket
import tempfile
import time
from dataclasses import dataclass

from ..proto import DIALECTS, EMPTY_HELLO, ClientConnection, Dialect, HelloRequest, ProtocolError, \
    Response, pack_request
from .errors import MislabelledPeer, VerificationError
from .supervisor import ServerStartError, start_peer_server

HELLO_TIMEOUT = 5.0
# The HELLO layouts by major, from the rows: the first major whose HELLO carries conn_caps
# (what an unknown build is asked first) and the newest without them (the fallback).
CAPS_MAJOR = min(d.version for d in DIALECTS.values() if d.hello_caps)[0]
NO_CAPS_MAJOR = EMPTY_HELLO.version[0]
_RECV_BYTES = 4096  # a HELLO reply is 11 or 36 bytes; more than that is an error the codec names


@dataclass
class Verification:
    """What a server announced: its banner version and its HELLO reply."""

    banner: str | None
    hello: str | None
    flags: int | None = None
    seconds: float = 0.0

    @property
    def version(self) -> str | None:
        return self.hello or self.banner


def hello_dialect(major: int) -> Dialect:
    """The dialect whose HELLO layout a proto-``major`` peer uses: the newest known one of that
    major or below (a future major is assumed to keep the newest layout)."""
    ordered = sorted(DIALECTS.values(), key=lambda d: d.version)
    fitting = [d for d in ordered if d.version[0] <= major]
    return fitting[-1] if fitting else ordered[0]


def hello_request(major: int) -> bytes:
    """HELLO as a proto-``major`` client sends it (empty before 4.0, conn_caps from 4.0)."""
    return pack_request(hello_dialect(major), HelloRequest())


def probe_hello(host: str, port: int, major: int,
                timeout: float = HELLO_TIMEOUT) -> tuple[tuple[int, int, int], int | None]:
    """Send HELLO in the proto-``major`` layout; returns ((major, minor, patch), flags or None).

    The exchange goes through the codec's client connection, so a reply is checked exactly as
    the reference client checks one. Raises VerificationError when there is no reply within
    ``timeout`` or it does not have the layout that major implies.
    """
    dialect = hello_dialect(major)
    conn = ClientConnection(dialect)
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(conn.send(HelloRequest()))
            while True:
                event = conn.next_event()
                if isinstance(event, Response):
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise socket.timeout("timed out")
                sock.settimeout(remaining)
                conn.receive_data(sock.recv(_RECV_BYTES))
    except (OSError, ConnectionError) as e:
        raise VerificationError(f"no HELLO reply from {host}:{port} ({e})") from None
    except ProtocolError as e:
        raise VerificationError(f"HELLO reply from {host}:{port} does not have the proto-{major} "
                                f"layout: {e}") from None
    reply = event.message
    return reply.version, (reply.flags if dialect.hello_caps else None)


def version_str(v: tuple[int, int, int]) -> str:
    return ".".join(map(str, v))


def verify_peer(peer, *, expected: str | None = None, timeout: float = 30.0) -> Verification:
    """Start ``peer``'s server on a free local port, read its banner, HELLO it, stop it.

    ``expected`` defaults to the peer's pinned proto. Raises MislabelledPeer if the banner or
    HELLO disagree with it (or with each other), VerificationError if it does not answer.
    """
    expected = expected or peer.proto or None  # "": a registry build says what it speaks
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"verify-{peer.name}-") as workdir:
        try:
            server = start_peer_server(peer, workdir=workdir, ready_timeout=timeout)
        except ServerStartError as e:
            raise VerificationError(f"{peer.name}: server did not start: {e}") from None
        with server:
            banner = server.banner_version
            major = int((expected or banner or str(CAPS_MAJOR)).split(".")[0])
            try:
                version, flags = probe_hello(server.host, server.port, major)
            except VerificationError as first:
                if expected is not None or major < CAPS_MAJOR:
                    raise VerificationError(f"{peer.name}: {first}; log: "
                                            + " | ".join(server.log_tail(6))) from None
                # Unknown build without a banner: it may be a 3.x server (empty HELLO).
                version, flags = probe_hello(server.host, server.port, NO_CAPS_MAJOR)
            hello = version_str(version)
    result = Verification(banner=banner, hello=hello, flags=flags,
                          seconds=time.monotonic() - started)
    if banner is not None and banner != hello:
        raise MislabelledPeer(f"mislabelled peer {peer.name}: banner says {banner}, "
                              f"HELLO says {hello}")
    if expected is not None and hello != expected:
        raise MislabelledPeer(f"mislabelled peer {peer.name}: expected proto {expected}, "
                              f"banner {banner or 'missing'}, HELLO {hello}")
    return result
