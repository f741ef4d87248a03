"""Emulated ggml-rpc RDMA transport: the names callers import, from the modules that hold them.

No machine here has an RDMA device, so the semantics of spec 10 are modelled in three layers:
:mod:`.rdma_core` (sans-IO: configuration per dialect generation, call cutting, send framing,
the receive policies, :func:`simulate_transfer`), :mod:`.rdma_wires` (the threaded in-memory
and socket fabrics) and :mod:`.rdma_endpoint` (the Transport endpoints, pairs and listener).
The per-connection verdict checks are the matrix's (:mod:`harness.matrix.rdma`).
"""

from __future__ import annotations

from .rdma_core import (APP, C_NEW, C_OLD, GENERATIONS, OLD, PARTIAL, READ_CALLS,  # noqa: F401
                        RECV_POLICIES, REQUEST, RESPONSE, SEED000, SEND_FRAMINGS, V9,
                        WHOLE_COMPLETION, WRITES, CallCutter, CompletionReader, RdmaConfig,
                        RdmaError, RdmaHang, RdmaOverrun, SendFramer, TransferResult,
                        config_for_dialect, cut_writes, make_cutter, simulate_transfer)
from .rdma_endpoint import (CLIENT, LIVENESS_INTERVAL, SERVER, EmuPair,  # noqa: F401
                            EndpointStats, RdmaEmuEndpoint, RdmaEmuListener, RdmaEndpoint,
                            connect_emu, emu_pair, tcp_socket_pair)
from .rdma_wires import (EOF, MEMORY, SOCKET, MemoryWire, NullWire, SocketWire,  # noqa: F401
                         Wire, WireStats, make_wires, next_qpn)

# the names harness.transport.verbs imports
_Wire, _NullWire, _next_qpn = Wire, NullWire, next_qpn
