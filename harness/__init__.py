"""ggml-rpc-harness: the protocol test harness, interoperability matrix and fuzzer for
llama.cpp's ggml-rpc wire protocol."""

import os

# numpy's OpenBLAS starts a thread per core that spins between calls: the harness's products
# are a few small vectors per scenario, and the spinning threads took a fifth of the CPU of
# a matrix run (its peers' agents inherit this too). Set it yourself to override.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
