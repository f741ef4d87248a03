"""The wire's primitives have one home and one frame walker, and the names the house settled
(issue 34) mean one thing each: every one is defined in one module of harness/."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.proto.wire import (REQUEST_HEADER_SIZE, RESPONSE_HEADER_SIZE, FrameWalker,
                                frame_heads, iter_response_payloads, request_frame,
                                response_frame, split_request_frames)

HARNESS = Path(__file__).resolve().parent.parent / "harness"

# ------------------------------------------------------------------ the frame walker

_requests = st.lists(st.tuples(st.integers(0, 255), st.binary(max_size=40)), max_size=8)


def _cut(data: bytes, cuts: list[int]) -> list[bytes]:
    edges = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in zip(edges, edges[1:])]


@settings(max_examples=200)
@given(_requests, st.lists(st.integers(0, 1 << 16), max_size=12),
       st.integers(0, REQUEST_HEADER_SIZE - 1))
def test_the_walker_finds_the_same_frames_however_the_bytes_are_cut(frames, cuts, tail):
    data = b"".join(request_frame(c, p) for c, p in frames) + bytes(tail)  # a header cut short
    whole = frame_heads(data, requests=True)
    walker = FrameWalker(requests=True)
    pieces = [p for part in _cut(data, cuts) for p in walker.feed(part)]
    assert [p.frame for p in pieces if p.header and p.frame] == whole
    assert [(f.cmd, f.length) for f in whole] == [(c, len(p)) for c, p in frames]
    assert sum(p.hi - p.lo for p in pieces) == len(data)  # every byte in exactly one piece
    split = split_request_frames(data)
    assert b"".join(split) == data and len(split) == len(frames) + (tail > 0)


@settings(max_examples=100)
@given(st.lists(st.binary(max_size=40), max_size=8), st.lists(st.integers(0, 1 << 16), max_size=8))
def test_skipped_payload_walks_like_the_bytes_themselves(payloads, cuts):
    # a recording elides payload bytes: walking past them must find the same frames
    stream = b"".join(response_frame(p) for p in payloads)
    walker, found = FrameWalker(requests=False), []
    heads = frame_heads(stream, requests=False)
    payload_bytes = {i for f in heads for i in range(f.payload, f.end)}
    for part_start, part in _offsets(_cut(stream, cuts)):
        if part and all(part_start + i in payload_bytes for i in range(len(part))):
            found += [p.frame for p in walker.skip(len(part)) if p.header and p.frame]
        else:
            found += [p.frame for p in walker.feed(part) if p.header and p.frame]
    assert found == heads
    assert [p for _, p in iter_response_payloads(stream)] == payloads
    assert all(f.payload - f.start == RESPONSE_HEADER_SIZE for f in heads)


def _offsets(parts):
    at = 0
    for p in parts:
        yield at, p
        at += len(p)


def test_a_walker_that_miscounts_a_header_fails_the_property():
    # planted: a walker that takes a request header for a response header (8 bytes)
    data = request_frame(6, bytes(20)) + request_frame(15)
    wrong = FrameWalker(requests=True)
    wrong.header_size = RESPONSE_HEADER_SIZE
    assert [p.frame for p in wrong.feed(data) if p.header and p.frame] != \
        frame_heads(data, requests=True)


# ------------------------------------------------------------------ one name, one meaning

# Each was defined in two or more modules before (issue 34) or is a wire primitive.
SETTLED = ("Site", "MutationSite", "Divergence", "WireDivergence", "Outcome", "OutcomeName",
           "PredicateAnswer", "Buffer", "AgentBuffer", "run_case", "run_rdma_case",
           "server_argv", "image_server_argv", "U64", "U64_FIELD", "U64_MAX", "U32_MAX",
           "I32_MAX", "I32_MIN", "I64_MAX", "GRAPH_CACHE_MAX", "VERDICTS", "BehaviourView",
           "UploadTiming", "LoadprofRecord", "fingerprint", "request_header", "request_frame",
           "FrameWalker", "REQUEST_HEAD", "REQUEST_HEADER_SIZE", "RESPONSE_HEADER_SIZE",
           "run_profile", "run_phase_clock")


def top_level_definitions(root: Path) -> dict[str, list[str]]:
    """name -> the modules under ``root`` that define it at top level (class, def, assignment;
    an import is not a definition)."""
    out: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                names = [node.name]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            else:
                continue
            for name in dict.fromkeys(names):
                out[name].append(str(path.relative_to(root)))
    return out


def defined_more_than_once(root: Path, names) -> dict[str, list[str]]:
    defs = top_level_definitions(root)
    return {n: defs[n] for n in names if len(defs.get(n, [])) > 1}


def test_the_settled_names_are_defined_once():
    assert not defined_more_than_once(HARNESS, SETTLED)


def public_classes(root: Path) -> list[str]:
    return sorted({node.name for path in root.rglob("*.py")
                   for node in ast.parse(path.read_text()).body
                   if isinstance(node, ast.ClassDef) and not node.name.startswith("_")})


def test_every_public_class_name_means_one_thing():
    """A type is named once in the package: two `Design`s (a matrix design and a covering
    array's), two `Figure`s, two `Violation`s were each a reader's guess. Functions may
    repeat across modules (`main`, `render`), read with their module's name."""
    assert not defined_more_than_once(HARNESS, public_classes(HARNESS))


def test_a_second_class_of_one_name_is_found(tmp_path):
    # planted: the covering array's Design beside the matrix's
    (tmp_path / "model.py").write_text("class Design:\n    pass\n")
    (tmp_path / "interactions.py").write_text("class Design:\n    rows = ()\n")
    assert defined_more_than_once(tmp_path, public_classes(tmp_path)) == \
        {"Design": ["interactions.py", "model.py"]}


def test_a_second_definition_of_a_settled_name_is_found(tmp_path):
    # planted: U64_MAX written again beside the wire's
    (tmp_path / "wire.py").write_text("U64_MAX = (1 << 64) - 1\n")
    (tmp_path / "case.py").write_text("from .wire import U64\nU64_MAX = 0xFFFF_FFFF_FFFF_FFFF\n")
    assert defined_more_than_once(tmp_path, ("U64_MAX", "U64")) == \
        {"U64_MAX": ["case.py", "wire.py"]}


def hand_built_headers(root: Path) -> list[str]:
    """Modules other than proto/wire.py that pack the request header's struct themselves."""
    return [str(p.relative_to(root)) for p in sorted(root.rglob("*.py"))
            if p.relative_to(root) != Path("proto/wire.py") and '"<BQ"' in p.read_text()]


def test_only_the_wire_packs_the_request_header():
    assert not hand_built_headers(HARNESS)


def test_a_hand_built_header_is_found(tmp_path):
    (tmp_path / "framing.py").write_text('import struct\nH = struct.pack("<BQ", 6, 0)\n')
    assert hand_built_headers(tmp_path) == ["framing.py"]
