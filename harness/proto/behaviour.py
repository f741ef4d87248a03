"""What a dialect's peers do that the message formats do not say: the parts of a dialect row
(:class:`harness.proto.dialects.Dialect`) besides its wire switches.

Two peers can share a wire format and still differ on the wire: whether the client hashes
before uploading, whether the server validates a SET_TENSOR header before reading its payload,
how the RDMA data path cuts and receives the stream. Each is a small frozen record here with
the presets the known generations use; a dialect row names one of each, and the reference
peers (``harness.reference.behaviour_view``) and the RDMA transport (``harness.transport.rdma_core``)
read them from the row, never from the dialect's name.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .constants import RDMA_TX_SLOTS_NEW, RDMA_TX_SLOTS_OLD, SERVER_STREAM_CHUNK_9

# Client hashing policies (spec 9, 12.3):
#   "always"  - proto 7/8: SET_TENSOR_HASH first for every weights upload > 10 MiB
#   "if-flag" - seed 000 / 9.0.0: only when the server's HELLO carries the cache flag
HASH_ALWAYS, HASH_IF_FLAG = "always", "if-flag"
HASH_POLICIES = (HASH_ALWAYS, HASH_IF_FLAG)

# Server receive policies for SET_TENSOR:
#   "whole"    - read the whole payload, then validate (real 7.0.0 / 8.0.0 server)
#   "streamed" - validate the header first and close before reading a bad payload (seed 000,
#                9.0.0 [INF: the PR describes a header-first chunked read])
RECEIVE_WHOLE, RECEIVE_STREAMED = "whole", "streamed"
RECEIVE_POLICIES = (RECEIVE_WHOLE, RECEIVE_STREAMED)

# RDMA receive policies (spec 10): a whole-completion receiver copies each completion into
# the current recv_data call (proto 7); a partial one serves reads of any size from a cursor.
WHOLE_COMPLETION, PARTIAL = "whole-completion", "partial"
RECV_POLICIES = (WHOLE_COMPLETION, PARTIAL)
# How outgoing bytes become send_data calls / which recv_data calls a receiver makes:
# ``c-old`` / ``c-new`` as a C peer of proto 7 / seed 000 and 9.0.0, ``writes`` / ``app``
# the caller's own write / read boundaries.
C_OLD, C_NEW, WRITES, APP = "c-old", "c-new", "writes", "app"
SEND_FRAMINGS = (C_OLD, C_NEW, WRITES)
READ_CALLS = (C_OLD, C_NEW, APP)


def _one_of(value, allowed: tuple, what: str) -> None:
    if value not in allowed:
        raise ValueError(f"{what} must be one of {allowed}, got {value!r}")


@dataclass(frozen=True)
class PeerBehaviour:
    """How the reference client and server of a dialect use the wire."""

    client_hash: str  # HASH_ALWAYS / HASH_IF_FLAG
    server_receive: str  # RECEIVE_WHOLE / RECEIVE_STREAMED
    server_chunk: int  # at most this many payload bytes per receive call (the C loop's step)
    client_zero_copy: bool  # header and caller's data written separately, no staging copy
    # SET_TENSOR_HASH: the server reads (validates) the tensor before the cache lookup, so a
    # bad tensor closes even without a cache (8.0.0 [V p8]); 7.0.0 looks up first [V]
    server_hash_checks_tensor: bool
    # A tensor whose data lies outside its buffer: the real server closes the connection (8.0.0
    # [V p8]); 7.0.0 aborts on a GGML_ASSERT in deserialize_tensor [V]. (The reference server
    # closes in every dialect: it does not reproduce the abort.)
    server_tensor_bounds_close: bool
    # FREE_BUFFER drops the connection's stored graphs, so a GRAPH_RECOMPUTE after it closes
    # (7.0.0 on [V]). Before 7.0.0 the stored graph is kept and a recompute runs it over the
    # freed buffer: the connection stays open on p3 .. p6, a heap-use-after-free under
    # p5+asan+ubsan [V]. (The reference server drops the graphs in every dialect: it does not
    # reproduce the use-after-free, which the accepted-out-of-bounds oracle flags.)
    server_free_drops_graphs: bool

    def __post_init__(self):
        _one_of(self.client_hash, HASH_POLICIES, "client_hash")
        _one_of(self.server_receive, RECEIVE_POLICIES, "server_receive")
        if self.server_chunk < 1:
            raise ValueError("server_chunk must be >= 1")


@dataclass(frozen=True)
class RdmaGeneration:
    """A generation of the RDMA data path (spec 10): what differs between peers of two
    dialects. Device limits that every generation shares (chunk, receive depth) stay in
    ``harness.transport.rdma_core.RdmaConfig``."""

    name: str
    send_slots: int  # SENDs in flight: 1 = stop-and-wait
    recv_policy: str  # WHOLE_COMPLETION / PARTIAL
    send_framing: str  # C_OLD / C_NEW / WRITES
    read_calls: str  # C_OLD / C_NEW / APP
    data_read_piece: int | None = None  # c-new reads: SET_TENSOR data read in such pieces

    def __post_init__(self):
        _one_of(self.recv_policy, RECV_POLICIES, "recv_policy")
        _one_of(self.send_framing, SEND_FRAMINGS, "send_framing")
        _one_of(self.read_calls, READ_CALLS, "read_calls")
        if self.send_slots < 1:
            raise ValueError("send_slots must be >= 1")


# proto 7 (and every row before it, but for the graphs a free drops): hash every big upload,
# read the whole payload, one staged message
OLD_PEERS = PeerBehaviour(client_hash=HASH_ALWAYS, server_receive=RECEIVE_WHOLE,
                          server_chunk=SERVER_STREAM_CHUNK_9, client_zero_copy=False,
                          server_hash_checks_tensor=False, server_tensor_bounds_close=False,
                          server_free_drops_graphs=True)
# before 7.0.0: as proto 7, but a freed buffer's stored graph is kept (and recomputed)
PRE7_PEERS = replace(OLD_PEERS, server_free_drops_graphs=False)
# 8.0.0: as proto 7, but SET_TENSOR_HASH validates its tensor first and a tensor outside its
# buffer closes (both recorded from p8)
PEERS_8 = replace(OLD_PEERS, server_hash_checks_tensor=True, server_tensor_bounds_close=True)
# seed 000 and 9.0.0 carry the load-time changes: hash only when the server caches, validate
# the header first, header and caller's buffer written separately
LOAD_OPT_PEERS = PeerBehaviour(client_hash=HASH_IF_FLAG, server_receive=RECEIVE_STREAMED,
                               server_chunk=SERVER_STREAM_CHUNK_9, client_zero_copy=True,
                               server_hash_checks_tensor=False, server_tensor_bounds_close=False,
                               server_free_drops_graphs=True)
# 9.0.0 is built on 8.0.0, so its tensor validation is 8.0.0's [INF]
LOAD_OPT_PEERS_9 = replace(LOAD_OPT_PEERS, server_hash_checks_tensor=True,
                           server_tensor_bounds_close=True)

# proto 7 (and 8): stop-and-wait, whole-completion receive, C framing of proto 7
RDMA_PROTO7 = RdmaGeneration("proto-7", send_slots=RDMA_TX_SLOTS_OLD,
                             recv_policy=WHOLE_COMPLETION, send_framing=C_OLD, read_calls=C_OLD)
# seed 000 branch: 8-slot send ring drained at flush, partial receive, split SET_TENSOR
RDMA_SEED000 = RdmaGeneration("seed-000", send_slots=RDMA_TX_SLOTS_NEW, recv_policy=PARTIAL,
                              send_framing=C_NEW, read_calls=C_NEW)
# upstream 9.0.0: partial receive only (no send pipelining described), split SET_TENSOR,
# server reads SET_TENSOR data through a 16 MiB buffer
RDMA_V9 = RdmaGeneration("9.0.0", send_slots=RDMA_TX_SLOTS_OLD, recv_policy=PARTIAL,
                         send_framing=C_NEW, read_calls=C_NEW,
                         data_read_piece=SERVER_STREAM_CHUNK_9)
