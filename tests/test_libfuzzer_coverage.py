"""Server code coverage (harness.fuzz.coverage) from a recorded llvm-cov-16 export: the p7
coverage build replaying the generator's 167 seed sessions (trimmed to the file summaries and
ggml-rpc.cpp's functions, paths rewritten to /src/llama.cpp)."""

from __future__ import annotations

import json
from pathlib import Path

from harness.fuzz.coverage import render_coverage_markdown, summarise

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "coverage" / "p7-llvm-cov-export.json"


def test_summary_puts_ggml_rpc_first_and_counts_server_functions():
    s = summarise(json.loads(FIX.read_text()), n_inputs=167)
    assert s["files"][0]["file"] == "ggml/src/ggml-rpc/ggml-rpc.cpp"
    assert s["rpc"]["lines_covered"] == 554 and s["rpc"]["lines"] == 1675
    # Only the server side counts: rpc_server::*, rpc_serve_client, recv_msg, send_msg, ...
    assert s["server_functions"] == 26 and s["server_functions_reached"] == 25
    assert s["rpc_unreached_functions"] == ["ggml_backend_rpc_start_server"]
    assert s["total"]["lines"] >= s["rpc"]["lines"]


def test_an_unreached_server_function_is_listed():
    data = json.loads(FIX.read_text())
    for fn in data["data"][0]["functions"]:
        if "graph_compute" in fn["name"] and "rpc_server" in fn["name"]:
            fn["count"] = 0  # planted: as if no input had reached GRAPH_COMPUTE
    s = summarise(data)
    assert "rpc_server::graph_compute" in s["rpc_unreached_functions"]
    md = "\n".join(render_coverage_markdown(s))
    assert "`rpc_server::graph_compute`" in md and "| `ggml/src/ggml-rpc/ggml-rpc.cpp` |" in md


def test_coverage_errors_are_reported_not_hidden():
    assert render_coverage_markdown({"error": "no profile"})[2] == "Not measured: no profile"
    assert render_coverage_markdown(None) == []
