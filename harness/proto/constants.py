"""Wire constants (spec appendix A.3) and the command names."""

from __future__ import annotations

from enum import Enum

HELLO_ID = 14  # pinned by a static_assert in every version
CONN_CAPS_SIZE = 24
HASH_THRESHOLD = 10 * 1024 * 1024  # strictly greater-than triggers SET_TENSOR_HASH
SET_TENSOR_HEADER_SIZE = 305  # rpc_tensor + cache_flag + offset (proto >= 7)
FNV_OFFSET_BASIS = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3

# [INF] Seed 000 and PR #29413 turn HELLO response byte 3 into "server flags" with a cache
# bit (RPC_SERVER_FLAG_CACHE) but neither gives its numeric value. Bit 0 is an assumption;
# every use of the bit goes through this one name so a real 9.0.0 build can correct it.
SERVER_FLAG_CACHE = 0x01

DEFAULT_PORT = 50052
TCP_MAX_CHUNK = 1 << 30  # the C transport sends/receives at most 1 GiB per syscall
GRAPH_CACHE_MAX = 1024  # proto 8 per-device graph cache, kept in lock-step by both sides
SERVER_STREAM_CHUNK_9 = 16 * 1024 * 1024  # [SEED1] 9.0.0 server reads SET_TENSOR data in 16 MiB chunks

# RDMA transport (spec 10)
RDMA_CHUNK = 256 * 1024
RDMA_RX_RING = 24
RDMA_TX_SLOTS_OLD = 1
RDMA_TX_SLOTS_NEW = 8

# Buffer usage values of ggml_backend_buffer_usage; WEIGHTS enables the client's hash path.
BUFFER_USAGE_ANY, BUFFER_USAGE_WEIGHTS, BUFFER_USAGE_COMPUTE = 0, 1, 2


class Cmd(str, Enum):
    """Command names. Wire ids are per dialect (19 means different things in 7.0.1 and 8.0.0)."""

    ALLOC_BUFFER = "ALLOC_BUFFER"
    GET_ALIGNMENT = "GET_ALIGNMENT"
    GET_MAX_SIZE = "GET_MAX_SIZE"
    BUFFER_GET_BASE = "BUFFER_GET_BASE"
    FREE_BUFFER = "FREE_BUFFER"
    BUFFER_CLEAR = "BUFFER_CLEAR"
    SET_TENSOR = "SET_TENSOR"
    SET_TENSOR_HASH = "SET_TENSOR_HASH"
    GET_TENSOR = "GET_TENSOR"
    COPY_TENSOR = "COPY_TENSOR"
    GRAPH_COMPUTE = "GRAPH_COMPUTE"
    GET_DEVICE_MEMORY = "GET_DEVICE_MEMORY"
    INIT_TENSOR = "INIT_TENSOR"
    GET_ALLOC_SIZE = "GET_ALLOC_SIZE"
    HELLO = "HELLO"
    DEVICE_COUNT = "DEVICE_COUNT"
    GRAPH_RECOMPUTE = "GRAPH_RECOMPUTE"
    MEMSET_TENSOR = "MEMSET_TENSOR"
    GET_DEVICE_SUPPORTS_OP = "GET_DEVICE_SUPPORTS_OP"  # 7.0.1 variant only
    SET_TENSOR_2D = "SET_TENSOR_2D"
    GET_TENSOR_2D = "GET_TENSOR_2D"
    COMM_INIT = "COMM_INIT"
    COMM_ALLREDUCE = "COMM_ALLREDUCE"
    COMM_FREE = "COMM_FREE"

    def __str__(self) -> str:
        return self.value
