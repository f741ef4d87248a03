"""Emulated ggml-rpc RDMA transport: the names callers import, from the modules that hold them.

No machine here has an RDMA device, so the semantics of spec 10 are modelled in three layers:
:mod:`.rdma_core` (sans-IO: configuration per dialect generation, call cutting, send framing,
the receive policies, :func:`simulate_transfer`), :mod:`.rdma_wires` (the threaded in-memory
and socket fabrics) and :mod:`.rdma_endpoint` (the Transport endpoints, pairs and listener).
The generations themselves are data in the dialect rows (:mod:`harness.proto.behaviour`); the
per-connection verdict checks are the matrix's (:mod:`harness.matrix.rdma`).
"""

from __future__ import annotations

from ..proto.behaviour import (APP, C_NEW, C_OLD, PARTIAL, READ_CALLS, RECV_POLICIES,
                               SEND_FRAMINGS, WHOLE_COMPLETION, WRITES)
from .rdma_core import (OLD, REQUEST, RESPONSE, SEED000, V9, CallCutter,
                        CompletionReader, RdmaConfig, RdmaError, RdmaHang, RdmaOverrun,
                        SendFramer, TransferResult, config_for_dialect, cut_writes, make_cutter,
                        simulate_transfer)
from .rdma_endpoint import (CLIENT, LIVENESS_INTERVAL, SERVER, EmuPair, EndpointStats,
                            RdmaEmuEndpoint, RdmaEmuListener, RdmaEndpoint, connect_emu,
                            emu_pair, tcp_socket_pair)
from .rdma_wires import (EOF, MEMORY, SOCKET, MemoryWire, NullWire, SocketWire, Wire,
                         WireStats, make_wires, next_qpn)

# the names harness.transport.verbs imports
_Wire, _NullWire, _next_qpn = Wire, NullWire, next_qpn

__all__ = [
    "APP", "C_NEW", "C_OLD", "PARTIAL", "READ_CALLS", "RECV_POLICIES", "SEND_FRAMINGS",
    "WHOLE_COMPLETION", "WRITES", "OLD", "REQUEST", "RESPONSE", "SEED000", "V9",
    "CallCutter", "CompletionReader", "RdmaConfig", "RdmaError", "RdmaHang", "RdmaOverrun",
    "SendFramer", "TransferResult", "config_for_dialect", "cut_writes", "make_cutter",
    "simulate_transfer", "CLIENT", "LIVENESS_INTERVAL", "SERVER", "EmuPair", "EndpointStats",
    "RdmaEmuEndpoint", "RdmaEmuListener", "RdmaEndpoint", "connect_emu", "emu_pair",
    "tcp_socket_pair", "EOF", "MEMORY", "SOCKET", "MemoryWire", "NullWire", "SocketWire", "Wire",
    "WireStats", "make_wires", "next_qpn", "_Wire", "_NullWire", "_next_qpn",
]
