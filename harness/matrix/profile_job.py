"""``harness profile``: a model-sized upload through every cell of a design, with and without a
server cache, tabulated like seed 000's interoperability table."""

from __future__ import annotations

import json
import os
from pathlib import Path

from rich.console import Console

from ..capture.upload_timing import UploadTiming, plot, time_uploads
from ..capture.transcript import C2S, Transcript
from ..proto import Cmd, Session
from .cells import Cell
from .execute import run_cells
from .job import new_run_id
from .model import CELLS, Matrix


def profile_cells(matrix: Matrix, designs: list[str]) -> list[Cell]:
    cells = []
    for dname in designs:
        d = matrix.designs[dname]
        for crole, srole in CELLS:
            for cache in (False, True):
                cells.append(Cell(dname, crole, srole, d.roles[crole], d.roles[srole], cache, "load"))
    return cells


def upload_wall(tr: Transcript, session: Session) -> float:
    """Seconds from the connection's first byte to the last one before the client starts
    reading back (the load scenario checks every tensor after its upload)."""
    if not tr.chunks:
        return 0.0
    first_get = next((e.req_offset for e in session.exchanges if e.cmd is Cmd.GET_TENSOR), None)
    end, sent = tr.chunks[0].t, 0
    for c in tr.chunks:
        if c.direction == C2S:
            if first_get is not None and sent >= first_get:
                break
            sent += c.length
        end = c.t
    return end - tr.chunks[0].t


def run_profile(matrix: Matrix, designs: list[str], out_root: Path, *, size: int,
                console: Console) -> tuple[Path, int]:
    os.environ["GGML_RPC_HARNESS_LOAD_BYTES"] = str(size)  # read by scenarios/load.py
    run_id = new_run_id("profile")
    run_dir = out_root / run_id
    cells = profile_cells(matrix, designs)
    with console.status(f"profiling {len(cells)} cells ({size >> 20} MiB each, one at a time)"):
        rows = run_cells(matrix, cells, run_dir, run_id=run_id, workers=1)
    records, curves = [], {}
    for r in rows:
        folder = run_dir / r["folder"]
        conns = sorted(folder.glob("conn*.rpct"), key=lambda f: int(f.stem[4:]))
        if r["verdict"] != "pass" or not conns:
            continue
        for n, path in enumerate(conns):
            tr = Transcript.load(path)
            session = tr.decode()
            p: UploadTiming = time_uploads(tr, session)
            wall = upload_wall(tr, session)
            which = "cold" if n == 0 else "warm"
            rec = {"design": r["design"], "pair": r["pair"], "client": r["client"],
                   "server": r["server"], "cache": r["cache"], "load": which, "wall": wall,
                   **p.to_dict()}
            records.append(rec)
            curves[f"{r['design']} {r['client']}->{r['server']}"
                   f"{' +cache' if r['cache'] else ''} {which}"] = p
    (run_dir / "profile.json").write_text(json.dumps(records, indent=1))
    with open(run_dir / "profile.md", "w") as f:
        f.write("| design | client | server | cache | load | upload span | hashing | wire | gaps "
                "| wall | SET_TENSOR | hash calls | hits |\n" + "|---" * 13 + "|\n")
        for rec in records:
            f.write(f"| {rec['design']} | {rec['client']} | {rec['server']} | "
                    f"{'on' if rec['cache'] else 'off'} | {rec['load']} | "
                    f"{rec['upload_span']:.2f} | {rec['hashing_seconds']:.2f} | "
                    f"{rec['wire_seconds']:.2f} | {rec['gap_seconds']:.2f} | {rec['wall']:.2f} | "
                    f"{rec['set_tensor_calls']} | {rec['hash_calls']} | {rec['hash_hits']} |\n")
    plot(curves, run_dir / "load.png", title=f"{size >> 20} MiB weight upload per cell")
    # a plain table reads in any terminal width and in CI logs
    console.print((run_dir / "profile.md").read_text(), highlight=False, markup=False)
    for r in rows:
        if r["verdict"] != "pass":
            console.print(f"{r['cell_id']}: {r['verdict']}: {r['reason']}", highlight=False)
    console.print(f"profile: {run_dir}", highlight=False)
    bad = [r for r in rows if r["verdict"] not in ("pass", "skip")]
    return run_dir, 1 if bad else 0
