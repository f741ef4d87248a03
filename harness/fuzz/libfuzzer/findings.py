"""An in-process finding made a reproducer and replayed: saved like a live campaign's
(``crashes/<id>/repro.rpct``, pcap, ``finding.json``, ``test_repro.py``, plus ``input.bin``
for the fuzz target) and replayed with :func:`harness.fuzz.replay.replay` against the live
server it needs (the release server, or the pin's sanitizer build for a sanitizer error)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from .. import sanitizer
from ..errors import TargetError
from ..shrink import save_reproducer
from ..signature import Signature
from ..target_spec import TargetSpec
from . import corpus as lfc
from .config import ENGINE, SANITIZE, LibFuzzerConfig
from .triage import Failure


def replay_target(cfg: LibFuzzerConfig, sig: Signature) -> tuple[str, str | None]:
    """The live server a finding replays against, and why it cannot run (None: it can).
    A sanitizer error needs the pin's sanitizer build: the release server mostly survives
    it (a memcpy between overlapping ranges, an out-of-bounds read inside the heap). So does
    the sanitizer runtime's RSS bound: the in-process RSS counts ASan's shadow memory and
    quarantine, which the sanitizer server has too and the release server has not."""
    sanitizer_error = sig.kind == "crash" and sanitizer.report_key(sig.line) is not None
    asan_rss = sig.kind == "memory" and sanitizer.rss_bound(sig.line) and \
        sig.line.startswith(("AddressSanitizer", "LeakSanitizer"))
    if not (sanitizer_error or asan_rss):
        return cfg.target, None
    return sanitizer_build(cfg)


def sanitizer_build(cfg: LibFuzzerConfig) -> tuple[str, str | None]:
    """The pin's live sanitizer server, and why it cannot run (None: it can)."""
    if cfg.sanitizer_target:
        return cfg.sanitizer_target, None
    from ...impls.registry import get_peer, resolve_pin
    from ...impls.errors import PeerError
    pin = TargetSpec.parse(cfg.target).name
    try:
        name = resolve_pin(pin).variant(sanitize=SANITIZE).name
        peer = get_peer(name)
    except PeerError as e:
        return f"{pin}+asan+ubsan", str(e)
    if not peer.available:
        return name, (f"{name} is not built (`harness peers build {pin} --sanitize "
                      f"{','.join(SANITIZE)}`)")
    return name, None


def replayed(cfg: LibFuzzerConfig, folder: Path, dialect: str, target: str,
              missing: str | None) -> dict:
    from ..replay import replay
    try:
        if missing:
            raise TargetError(missing)
        result = replay(folder / "repro.rpct", target, dialect=dialect, deadline=cfg.deadline,
                        as_limit=cfg.as_limit, rss_limit=cfg.rss_limit)
        return {"replayed_against": target, "replays": result.reproduced,
                "live_observed": result.observed.title() if result.observed else None}
    except TargetError as e:
        # not a "no": a finding whose replay could not run fails the campaign (report.py)
        return {"replayed_against": target, "replays": None, "replay_error": str(e),
                "live_observed": f"replay could not run: {e}"}


def save_finding(cfg: LibFuzzerConfig, f: Failure, out: Path, dialect: str, seen: Counter, *,
          minimised: bool = False, original_steps: int | None = None) -> dict:
    folder = out / "crashes" / f.signature.id
    case = lfc.input_to_case(f.data, dialect)

    def write(target: str) -> dict:
        # The reproducer's own target (its replay command and test_repro.py) is that server.
        return save_reproducer(folder, signature=f.signature, case=case, outcome=None,
                               target=target, dialect=dialect, detail=f.detail,
                               extra={"engine": ENGINE, "confirmed": True,
                                      "minimised": minimised,
                                      "original_steps": original_steps or len(case.steps),
                                      "occurrences": seen[f.signature], "source": f.source,
                                      "input": "input.bin", "campaign_target": cfg.target})

    target, missing = replay_target(cfg, f.signature)
    finding = write(target)
    (folder / "input.bin").write_bytes(f.data)
    if f.report:
        (folder / "report.txt").write_text(f.report)
    if cfg.replay:
        first = replayed(cfg, folder, dialect, target, missing)
        finding.update(first)
        if first["replays"] is False and target == cfg.target:
            # The release server survived: a failure that needs the allocator's contents (a
            # tensor read before it was written: ASan fills new memory with 0xbe where a
            # release build's fresh pages are zero) shows on the sanitizer server, which has
            # the target's allocator.
            san, san_missing = sanitizer_build(cfg)
            second = None if san_missing else replayed(cfg, folder, dialect, san, None)
            if second and second["replays"]:
                finding = write(san)
                finding.update(second, release_replays=False,
                               release_observed=first["live_observed"])
    (folder / "finding.json").write_text(json.dumps(finding, indent=1) + "\n")
    return finding
