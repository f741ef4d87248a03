"""The in-process engine's rate (issue 30): what the campaign's own run does differently from
everything that names a finding -- the allocation cap, UBSan without its stack trace, abort
events written once per campaign -- and that triage still names and confirms every finding
as a live sanitizer server would (docs/libfuzzer.md, "Rate")."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.fuzz.libfuzzer import running, triage as triage_module
from harness.fuzz.libfuzzer.config import IN_PROCESS_ALLOC_LIMIT, LibFuzzerConfig, \
    libfuzzer_args, sanitizer_env
from harness.fuzz.libfuzzer.triage import triage
from harness.proto import get_dialect
from harness.proto.codec import pack_request
from harness.proto.messages import AllocBufferRequest, GraphComputeRequest, HelloRequest
from needs import built

D = "7.0.0"
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "libfuzzer"
UBSAN_LINE = ("/src/llama.cpp/ggml/src/ggml.c:1556:21: runtime error: member access within null "
              "pointer of type 'const struct ggml_tensor'")
UBSAN_TRACE = UBSAN_LINE + """
    #0 0x55bf17c7f536 in ggml_is_empty /src/llama.cpp/ggml/src/ggml.c:1556:21
    #1 0x55bf179db8f6 in ggml_get_n_tasks /src/llama.cpp/ggml/src/ggml-cpu/ggml-cpu.c:2252:9
    #2 0x55bf179db8f6 in ggml_graph_plan /src/llama.cpp/ggml/src/ggml-cpu/ggml-cpu.c:2844:29
SUMMARY: UndefinedBehaviorSanitizer: undefined-behavior /src/llama.cpp/ggml/src/ggml.c:1556:21
"""
ASSERT_LINE = "/src/llama.cpp/ggml/src/ggml.c:1644: GGML_ASSERT(ctx->mem_buffer != NULL) failed"


def null_node_graph(*, alloc: int | None = None) -> bytes:
    """HELLO, optionally an ALLOC_BUFFER of ``alloc`` bytes, and a GRAPH_COMPUTE whose one node
    is id 0: the 7.0.0 server puts a null node in the graph and ggml_is_empty reads it (a UBSan
    report, then a null dereference)."""
    d = get_dialect(D)
    msgs = [HelloRequest()]
    if alloc is not None:
        msgs.append(AllocBufferRequest(device=0, size=alloc))
    msgs.append(GraphComputeRequest(device=0, nodes=(0,), tensors=()))
    return b"".join(pack_request(d, m) for m in msgs)


def write_event(folder: Path, stem: str, kind: str, body: str, data: bytes, *,
                capped: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.input").write_bytes(data)
    (folder / f"{stem}.event").write_text(
        f"kind: {kind}\ncommand: 10\noffset: {len(data)}\nlength: {len(data)}\n"
        f"capped: {capped}\n\n{body}\n")


def test_only_the_campaigns_own_run_is_capped_and_without_ubsan_traces(monkeypatch):
    monkeypatch.setenv("HARNESS_FUZZ_ALLOC_LIMIT", "1")  # inherited from a caller: not kept
    cfg = LibFuzzerConfig(target="p7")
    fuzzing = sanitizer_env(cfg, None, fuzzing=True)
    naming = sanitizer_env(cfg, None)
    assert fuzzing["HARNESS_FUZZ_ALLOC_LIMIT"] == str(IN_PROCESS_ALLOC_LIMIT)
    assert int(fuzzing["HARNESS_FUZZ_RSS_BOUND"]) == cfg.rss_limit  # no baseline given
    assert int(fuzzing["HARNESS_FUZZ_AS_LIMIT"]) == cfg.as_limit
    assert "print_stacktrace=0" in fuzzing["UBSAN_OPTIONS"]
    assert not {"HARNESS_FUZZ_ALLOC_LIMIT", "HARNESS_FUZZ_RSS_BOUND"} & set(naming)
    assert "print_stacktrace=1" in naming["UBSAN_OPTIONS"]
    # no cap asked, or one no lower than the address-space limit: none
    for off in (LibFuzzerConfig(target="p7", alloc_limit=0),
                LibFuzzerConfig(target="p7", as_limit=8 << 20)):
        assert "HARNESS_FUZZ_ALLOC_LIMIT" not in sanitizer_env(off, None, fuzzing=True)
    # ASan's leak check is off, so libFuzzer's (an input run twice) is too
    assert "-detect_leaks=0" in libfuzzer_args(cfg, 1, Path("d"), Path("a"), 10)


def _fake_rerun(monkeypatch, log: str | None) -> list[bytes]:
    ran: list[bytes] = []

    def rerun(binary, path, env, timeout):
        ran.append(Path(path).read_bytes())
        assert "HARNESS_FUZZ_ALLOC_LIMIT" not in env  # named as a live server would
        return log

    monkeypatch.setattr(running, "rerun", rerun)
    return ran


def test_ubsan_events_are_named_by_one_rerun_of_their_smallest_input(tmp_path, monkeypatch):
    events, artifacts = tmp_path / "events", tmp_path / "artifacts"
    artifacts.mkdir()
    small, large = null_node_graph(), null_node_graph(alloc=4096)
    write_event(events, "1-0", "ubsan", UBSAN_LINE, large)
    write_event(events, "2-0", "ubsan", UBSAN_LINE, small)
    ran = _fake_rerun(monkeypatch, UBSAN_TRACE)
    t = triage(Path("target"), events, artifacts, D, sanitizer_env(LibFuzzerConfig("p7"), None),
               5.0)
    assert ran == [small]  # one re-run for the two events, of the smaller input
    ((sig, failure),) = t.found.items()
    assert "in ggml_is_empty (ggml.c) < ggml_get_n_tasks" in sig.line
    assert t.seen[sig] == 2 and failure.data == small and t.unconfirmed == 0
    # Planted fault: taken as written, the event names the finding by UBSan's line alone,
    # which no live sanitizer server's report (with its stack) would match.
    monkeypatch.setattr(triage_module, "_needs_rerun", lambda head: False)
    planted = triage(Path("target"), events, artifacts, D, {}, 5.0)
    assert all("ggml_is_empty" not in s.line for s in planted.found)


def test_what_failed_after_the_cap_refused_memory_is_reported_only_if_it_fails_without(
        tmp_path, monkeypatch):
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    data = null_node_graph(alloc=64 << 20)
    capped = tmp_path / "capped"
    write_event(capped, "a-1", "abort", ASSERT_LINE, data, capped=1)
    ran = _fake_rerun(monkeypatch, None)  # without the cap the input runs to its end
    t = triage(Path("target"), capped, artifacts, D, {}, 5.0)
    assert ran == [data] and not t.found and t.unconfirmed == 1
    # Nothing refused: the event is the finding, without a re-run.
    plain = tmp_path / "plain"
    write_event(plain, "a-1", "abort", ASSERT_LINE, data, capped=0)
    ran.clear()
    t = triage(Path("target"), plain, artifacts, D, {}, 5.0)
    assert not ran and len(t.found) == 1
    assert "GGML_ASSERT(ctx->mem_buffer != NULL)" in next(iter(t.found)).line
    # Planted fault: a capped event taken as written is reported although the live server,
    # which has no cap, would not fail that way.
    monkeypatch.setattr(triage_module, "_needs_rerun", lambda head: False)
    assert triage(Path("target"), capped, artifacts, D, {}, 5.0).found


# ---------------------------------------------------------------- the real target

def _p7_target():
    from harness.fuzz.libfuzzer.build import build_target
    return built("the in-process p7 target", lambda: build_target("p7", "libfuzzer"))


def _run(binary: Path, data: bytes, folder: Path, env: dict) -> None:
    import subprocess
    path = folder / "input.bin"
    path.write_bytes(data)
    subprocess.run([str(binary), "-rss_limit_mb=0", str(path)], env=env, capture_output=True,
                   timeout=120)


@pytest.mark.realpeer
@pytest.mark.slow
def test_the_target_records_ubsan_deaths_and_what_the_cap_refused(tmp_path):
    build = _p7_target()
    cfg = LibFuzzerConfig(target="p7")
    data = null_node_graph(alloc=64 << 20)  # above the cap, far below --as-limit
    runs = {}
    for name, fuzzing in (("capped", True), ("uncapped", False)):
        events = tmp_path / name
        events.mkdir()
        _run(build.binary, data, tmp_path, sanitizer_env(cfg, events, fuzzing=fuzzing))
        ((event,),) = [list(events.glob("*.event"))]
        runs[name] = triage_module._read_event(event)
    head, body = runs["capped"]
    assert head["kind"] == "ubsan" and head["capped"] == "1"
    assert "ggml.c:1556" in body and "runtime error: " in body
    # Planted fault: without the cap the 64 MiB buffer is allocated, nothing is refused.
    assert runs["uncapped"][0]["capped"] == "0"
    # Triage names it by a re-run with UBSan's stack, as the live sanitizer server reports it.
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    t = triage(build.binary, tmp_path / "capped", artifacts, D, sanitizer_env(cfg, None), 30.0)
    ((sig, failure),) = t.found.items()
    assert "in ggml_is_empty (ggml.c)" in sig.line and failure.source == "ubsan event, re-run"


@pytest.mark.realpeer
@pytest.mark.slow
def test_an_abort_survived_is_written_once_per_campaign_and_still_found(tmp_path):
    """Two processes (two fork-mode jobs) meeting the same uncaught exception on the same
    request write one event between them; triage finds it."""
    build = _p7_target()
    cfg = LibFuzzerConfig(target="p7")
    data = (FIXTURES / "huge-graph-size.bin").read_bytes()
    events = tmp_path / "events"
    events.mkdir()
    for _ in range(2):
        _run(build.binary, data, tmp_path, sanitizer_env(cfg, events, fuzzing=True))
    survived = sorted(p.name for p in events.glob("*.event"))
    assert len(survived) == 1 and survived[0].startswith("a-"), survived
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    t = triage(build.binary, events, artifacts, D, sanitizer_env(cfg, None), 30.0)
    ((sig,),) = [list(t.found)]
    assert sig.line.startswith("terminate called after throwing an instance of")


@pytest.mark.realpeer
@pytest.mark.slow
def test_a_receive_buffer_the_cap_refused_past_the_rss_bound_is_still_a_memory_finding(
        tmp_path):
    """A GRAPH_COMPUTE announcing 512 MiB: the uncapped server zero-fills a receive buffer that
    large (past a 256 MiB bound), the capped campaign refuses it. The target records the
    refusal and triage's re-run without the cap finds what the live sanitizer server would."""
    import struct
    from harness.proto import Cmd
    build = _p7_target()
    d = get_dialect(D)
    data = pack_request(d, HelloRequest()) + bytes([d.id_of(Cmd.GRAPH_COMPUTE)]) + \
        struct.pack("<Q", 512 << 20) + bytes(16)
    cfg = LibFuzzerConfig(target="p7", rss_limit=256 << 20)
    baseline = 40
    events, artifacts = tmp_path / "events", tmp_path / "artifacts"
    events.mkdir()
    artifacts.mkdir()
    _run(build.binary, data, tmp_path, sanitizer_env(cfg, events, baseline, fuzzing=True))
    ((event,),) = [list(events.glob("*.event"))]
    assert triage_module._read_event(event)[0]["kind"] == "capped"
    t = triage(build.binary, events, artifacts, D, sanitizer_env(cfg, None, baseline), 60.0)
    assert [(s.kind, s.line, s.command) for s in t.found] == [
        ("memory", "AddressSanitizer: out-of-memory (rss)", "GRAPH_COMPUTE")]
    # Planted fault: a campaign whose target is not told the bound records nothing, and the
    # capped run itself died of nothing: the finding is lost.
    unbound = sanitizer_env(cfg, None, baseline, fuzzing=True)
    del unbound["HARNESS_FUZZ_RSS_BOUND"]
    lost = tmp_path / "lost"
    lost.mkdir()
    _run(build.binary, data, tmp_path, {**unbound, "HARNESS_FUZZ_EVENTS": str(lost)})
    assert not triage(build.binary, lost, artifacts, D, sanitizer_env(cfg, None, baseline),
                      60.0).found
