"""Fuzz inputs of the in-process target <-> the harness's cases.

An input is the client's side of one connection, frame after frame, with handles and bases
as the harness's sentinels (see :mod:`harness.fuzz.case`); the target relocates them against
the values its server hands out (``rpc_server_fuzzer.cpp``). So:

* :func:`case_to_input` -- a case's frames joined (up to the first step that shuts the
  connection down): the seed corpus is the structured generator's sessions, valid ones (with
  handles and bases learned on the connection) and mutated ones;
* :func:`input_to_case` -- the frames of an input as steps that learn what the target learned
  (the n-th ALLOC_BUFFER answer is buffer n's handle; a BUFFER_GET_BASE answer is the base of
  the buffer it asks about), so a libFuzzer finding replays against a live server;
* :func:`write_dictionary` -- command ids, frame headers (command + payload size) of every
  command the generator sends, HELLO, and the sentinels, for libFuzzer's ``-dict``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed as hyp_seed, settings

from ...proto.wire import (REQUEST_HEADER_SIZE, U64, announced_length,
                           split_request_frames as split_frames)
from ...capture.transcript import Transcript
from ...proto import Cmd, get_dialect
from ..case import BASE, HANDLE, Case, annotate, find_relocs, sentinel, step
from ..generate import cases
from ..shrink import transcript_of

CORPUS_FORMAT = "ggml-rpc-fuzz-corpus/1"


def case_to_input(case: Case) -> bytes:
    out = bytearray()
    for s in case.steps:
        out += s.frame
        if s.eof:
            break
    return bytes(out)


def input_to_case(data: bytes, dialect: str) -> Case:
    d = get_dialect(dialect)
    steps = []
    handles = 0
    frames = split_frames(data)
    for i, frame in enumerate(frames):
        cmd = d.ids.get(frame[0])
        name = cmd.value if cmd is not None else f"UNKNOWN_{frame[0]}"
        learn = None
        complete = len(frame) >= REQUEST_HEADER_SIZE and \
            len(frame) == REQUEST_HEADER_SIZE + announced_length(frame)
        if i == 0 and cmd is not Cmd.HELLO:
            pass
        elif cmd is Cmd.ALLOC_BUFFER and complete:
            learn = (HANDLE, handles)
            handles += 1
        elif cmd is Cmd.BUFFER_GET_BASE and complete:
            asked = [r for r in find_relocs(frame) if r.kind == HANDLE and r.offset == REQUEST_HEADER_SIZE
                     and r.addend == 0]
            if asked:
                learn = (BASE, asked[0].index)
        # The input ends here: the target saw the end of the stream, the replay shuts down.
        steps.append(step(frame, name, learn=learn, eof=i == len(frames) - 1 and not complete))
    return annotate(d, tuple(steps))


def input_name(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()  # libFuzzer's own naming of corpus files


def write_input(folder: Path, data: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / input_name(data)
    if not path.exists():
        path.write_bytes(data)
    return path


def draw_cases(dialect: str, n: int, *, seed: int = 0, mutation_odds: int = 8,
               max_steps: int = 24) -> list[Case]:
    """``n`` cases from the structured generator (the campaign's own strategy)."""
    out: list[Case] = []
    strategy = cases(dialect, max_steps=max_steps, mutation_odds=mutation_odds, local_only=True)

    @settings(database=None, max_examples=n, deadline=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck))
    @hyp_seed(seed)
    @given(strategy)
    def collect(case):
        out.append(case)

    collect()
    return out


def write_seed_corpus(folder: Path, dialect: str, *, valid: int = 150, mutated: int = 150,
                      seed: int = 0, sweep_max_len: int | None = None) -> int:
    """Seeds from the generator: valid sessions and mutated ones, and with ``sweep_max_len``
    every case of the deterministic sweep (harness/fuzz/sweep.py) whose input is no longer
    (the boundary classes, so coverage guidance starts from every edge). Returns files
    written."""
    inputs = {case_to_input(c) for c in draw_cases(dialect, valid, seed=seed, mutation_odds=0)}
    inputs |= {case_to_input(c) for c in draw_cases(dialect, mutated, seed=seed + 1)}
    if sweep_max_len:
        inputs.update(sweep_inputs(dialect, sweep_max_len))
    for data in inputs:
        write_input(folder, data)
    return len(inputs)


def sweep_inputs(dialect: str, max_len: int) -> list[bytes]:
    """Every case of the deterministic sweep whose input is at most ``max_len`` bytes, built
    once per version of the code it depends on (harness/fuzz/memo.py): building the sweep's
    29,478 cases of 7.0.0 (and its 60 MB graphs, only to drop them) took 17 of the 24 s a
    campaign spent before its fuzzer started."""
    from .. import memo

    def build() -> list[bytes]:
        from ..sweep import sweep
        return sorted({data for data in (case_to_input(c.case) for c in sweep(dialect))
                       if len(data) <= max_len})
    value = memo.cached("seed-inputs", f"{get_dialect(dialect).name}-{max_len}",
                        memo.closure_digest(__name__), build)
    return value if isinstance(value, list) else build()


def sweep_seed_dir(dialect: str, max_len: int) -> Path | None:
    """:func:`sweep_inputs` as a corpus folder in the user cache, written once per version of
    the code, for libFuzzer to read as one more seed folder: writing its 28,775 files took 12
    s of every campaign. None when the cache cannot be written (the caller writes them)."""
    from .. import memo

    def fill(folder: Path) -> None:
        for data in sweep_inputs(dialect, max_len):
            write_input(folder, data)
    return memo.cached_dir("seed-dir", f"{get_dialect(dialect).name}-{max_len}",
                           memo.closure_digest(__name__), fill)


def import_live_corpus(src: Path, folder: Path) -> int:
    """A live campaign's ``corpus/*.rpct`` (or reproducers) as inputs. Returns the count."""
    from ..replay import load
    n = 0
    for f in sorted(Path(src).glob("**/*.rpct")):
        try:
            case, _, _ = load(f)
        except (OSError, ValueError, KeyError):
            continue
        write_input(folder, case_to_input(case))
        n += 1
    return n


def export_corpus(inputs: Path, folder: Path, dialect: str, *, limit: int = 2000) -> int:
    """The in-process corpus as ``.rpct`` cases a live campaign replays first (``--corpus``)."""
    folder.mkdir(parents=True, exist_ok=True)
    n = 0
    for f in sorted(Path(inputs).iterdir())[:limit]:
        if not f.is_file():
            continue
        case = input_to_case(f.read_bytes(), dialect)
        if not case.steps:
            continue
        meta = {"format": CORPUS_FORMAT, "dialect": dialect, "case": case.to_json(),
                "behaviour": ["libfuzzer", f.name]}
        tr: Transcript = transcript_of(case, None, meta)
        tr.save(folder / f"lf-{f.name[:16]}.rpct")
        n += 1
    return n


def _escape(data: bytes) -> str:
    return "".join(f"\\x{b:02x}" for b in data)


def write_dictionary(path: Path, dialect: str, *, samples: int = 200) -> int:
    """A libFuzzer dictionary for ``dialect``. Returns the number of entries."""
    d = get_dialect(dialect)
    entries: dict[bytes, str] = {}
    for cmd_id, cmd in sorted(d.ids.items()):
        entries.setdefault(bytes([cmd_id]), f"cmd_{cmd.value}")
    for case in draw_cases(dialect, samples, seed=7, mutation_odds=0):
        for s in case.steps:
            if len(s.frame) >= REQUEST_HEADER_SIZE:
                entries.setdefault(s.frame[:REQUEST_HEADER_SIZE], f"head_{s.cmd}")
            if s.cmd == Cmd.HELLO.value:
                entries.setdefault(s.frame, "hello")
    for i in range(4):
        entries.setdefault(U64.pack(sentinel(HANDLE, i)), f"handle_{i}")
        entries.setdefault(U64.pack(sentinel(BASE, i)), f"base_{i}")
    lines = [f"# ggml-rpc {d.name}: command ids, frame headers, HELLO, buffer sentinels "
             "(generated by harness.fuzz.libfuzzer.corpus.write_dictionary)"]
    lines += [f'{name}="{_escape(data)}"' for data, name in entries.items()]
    path.write_text("\n".join(lines) + "\n")
    return len(entries)
