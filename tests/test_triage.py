"""Root-cause triage (harness/fuzz/triage.py): one row per fault site, worst first."""

from __future__ import annotations

from harness.fuzz.triage import SEVERITIES, root_cause_lines, root_causes, severity

ASSERT = ('ggml-backend.cpp:345: GGML_ASSERT(offset + size <= ggml_nbytes(tensor) && "tensor '
          'write out of bounds") failed')
WRITE = ("AddressSanitizer: heap-buffer-overflow WRITE size 4 in ggml_vec_add_f32 (vec.h:76) "
         "< ggml_compute_forward_add (binary-ops.cpp:120)")
READ = "AddressSanitizer: heap-buffer-overflow READ size 4 in ggml_vec_cpy (vec.h:40)"
UAF = ("AddressSanitizer: heap-use-after-free READ size 8 in rpc_server::free_buffer "
       "(ggml-rpc.cpp:1)")


def _finding(fid: str, kind: str, signal: str, line: str, command: str, steps: int = 3,
             field: str = "field:data_near_bounds tensor.data") -> dict:
    return {"id": fid, "signature": {"kind": kind, "signal": signal, "line": line,
                                     "command": command},
            "steps": steps, "bytes": 100 * steps,
            "listing": ["  0 HELLO                  33 B",
                        f"  1 {command:<20} 321 B  <- {field} value=1"]}


def test_one_site_reached_from_seven_commands_is_one_root_cause():
    cmds = ["SET_TENSOR", "GET_TENSOR", "COPY_TENSOR", "MEMSET_TENSOR", "INIT_TENSOR",
            "GET_ALLOC_SIZE", "GRAPH_COMPUTE"]
    fs = [_finding(f"crash-{c.lower()}-1", "crash", "SIGABRT", ASSERT, c, steps=3 + i,
                   field=f"field:placement {c.lower()}.data") for i, c in enumerate(cmds)]
    (rc,) = root_causes(fs)
    assert rc.commands == sorted(cmds) and rc.label == "reachable assert"
    assert rc.smallest["id"] == "crash-set_tensor-1"  # 3 steps, the fewest
    assert len(rc.variants) == 7 and rc.variants[0] == "field:placement set_tensor.data"


def test_severity_follows_clusterfuzz_order():
    order = [("crash", "SIGABRT", WRITE), ("crash", "SIGABRT", READ),
             ("crash", "SIGSEGV", "SIGSEGV wild address in libggml-base.so (ggml_op_name)"),
             ("crash", "SIGABRT", UAF),
             ("crash", "SIGSEGV", "SIGSEGV null page in libggml-cpu.so.0 (ggml_graph_plan)"),
             ("hang", "", "no answer within 5 s"), ("crash", "SIGSEGV", "SIGSEGV stack overflow"),
             ("memory", "", "resident memory above the bound"),
             ("crash", "SIGABRT", ASSERT),
             ("crash", "SIGABRT", "terminate called after throwing an instance of "
                                  "'std::length_error'"),
             ("protocol", "", "answer where none is due")]
    ranks = [severity(*x) for x in order]
    assert ranks == sorted(ranks), list(zip(ranks, order))
    assert [SEVERITIES[r] for r in ranks[:5]] == [
        "write out of bounds", "read out of bounds", "read out of bounds",
        "use after free / null dereference", "use after free / null dereference"]
    assert SEVERITIES[severity("protocol", "", "x")] == "protocol violation"


def test_the_table_lists_the_worst_first_and_hangs_keep_their_command():
    fs = [_finding("crash-a", "crash", "SIGABRT", ASSERT, "SET_TENSOR"),
          _finding("hang-b", "hang", "", "no answer within 5 s", "GRAPH_COMPUTE"),
          _finding("hang-c", "hang", "", "no answer within 5 s", "COPY_TENSOR"),
          _finding("crash-d", "crash", "SIGABRT", WRITE, "GRAPH_COMPUTE")]
    causes = root_causes(fs)
    assert [rc.label for rc in causes] == ["write out of bounds", "memory or liveness DoS",
                                           "memory or liveness DoS", "reachable assert"]
    lines = root_cause_lines(fs)
    assert lines[0] == "## Root causes" and "4 root cause(s) of 4 finding(s)" in lines[2]
    assert lines[6].startswith("| 1 | write out of bounds |")
    assert root_cause_lines([]) == []


def test_a_campaign_report_puts_root_causes_before_the_findings(tmp_path):
    from collections import Counter
    from harness.fuzz.report import build_report_from_parts, render_markdown
    totals = {"messages_sent": 10, "bytes_sent": 100, "cases": 2, "restarts": 1,
              "verdicts": 1, "duplicates": 0, "unconfirmed": 0, "shrink_attempts": 0}
    finding = {**_finding("crash-a", "crash", "SIGABRT", ASSERT, "SET_TENSOR"),
               "title": "crash", "replay": f"harness replay {tmp_path}/a/repro.rpct --target p7"}
    report = build_report_from_parts(
        {"target": "p7", "dialect": "7.0.0", "target_kind": "peer", "seed": 1, "workers": 1,
         "duration_s": 1, "rss_limit_bytes": 1, "deadline_s": 5},
        totals=totals, elapsed=1.0, coverage=Counter(), statuses={}, rss_peak=0,
        findings=[finding], errors=[], timing={}, extra={})
    text = render_markdown(report, tmp_path)
    assert text.index("## Root causes") < text.index("## Findings")
    assert report["root_causes"][0]["severity"] == "reachable assert"
