"""Step lists shared by the real-peer tests (a module of helpers, not of tests)."""

from __future__ import annotations

FILL_X, FILL_Y = {"pattern": "random", "seed": 1}, {"pattern": "random", "seed": 2}

# every kind of command a client sends, on one small buffer; the indices of the reads are
# what test_peers_pairs checks against numpy
BASIC_SESSION = [
    {"op": "device_count"}, {"op": "buffer_type"}, {"op": "device_memory"},
    {"op": "alloc_buffer", "name": "b", "size": 4096},
    {"op": "tensor", "name": "x", "buffer": "b", "offset": 0, "ne": [32]},
    {"op": "tensor", "name": "y", "buffer": "b", "offset": 1024, "ne": [32]},
    {"op": "set", "tensor": "x", "fill": FILL_X}, {"op": "set", "tensor": "y", "fill": FILL_Y},
    {"op": "node", "name": "z", "kind": "add", "inputs": ["x", "y"], "buffer": "b",
     "offset": 2048},
    {"op": "compute", "outputs": ["z"]}, {"op": "get", "tensor": "z"},
    {"op": "copy", "src": "x", "dst": "y"}, {"op": "get", "tensor": "y"},
    {"op": "clear", "buffer": "b", "value": 0}, {"op": "get", "tensor": "x"},
    {"op": "free_buffer", "buffer": "b"},
]
