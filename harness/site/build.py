"""``harness site``: a static site from report folders and the history store.

Each folder given is filed like ``harness history add`` would (without writing the store) and
copied into the site (hard links where the file system allows, so a local site costs no
space), so its cells link their transcripts, pcaps and logs. Records of runs whose folders
are not given still make their history strips and tables; their cells say their evidence is
not in the site.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..history import ingest, store
from ..history.errors import HistoryError
from . import cells, pages
from .links import broken_links
from .model import Site

UP = "<p><a href='../'>up</a></p>"
SECTION = {"matrix": "runs", "fuzz": "fuzz", "bench": "bench", "bisect": "bisect",
           "suite": "suite"}


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links not allowed: a copy
        shutil.copy2(src, dst)


def _index_directories(root: Path) -> None:
    """A listing page in every folder of a copied report that has none: the reports link
    cell folders (``folder/``), which a static host serves only as ``folder/index.html``."""
    for d in [root, *sorted(p for p in root.rglob("*") if p.is_dir() and not p.is_symlink())]:
        if (d / "index.html").exists():
            continue
        entries = sorted(d.iterdir())
        items = "".join(
            f"<li><a href='{pages.esc(e.name)}{'/' if e.is_dir() else ''}'>{pages.esc(e.name)}"
            f"{'/' if e.is_dir() else ''}</a></li>" for e in entries)
        title = d.relative_to(root.parent.parent).as_posix()
        (d / "index.html").write_text(
            f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>"
            f"{pages.esc(title)}</title></head><body><h1>{pages.esc(title)}</h1>"
            f"{'' if d == root else UP}<ul>{items}</ul></body></html>\n")


EVIDENCE = ("all", "failing")  # which cells of a matrix run keep their folders in the site
KEPT_VERDICTS = ("fail", "crash", "hang", "error")
NOT_KEPT = ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{cell}</title>"
            "</head><body><h1>{cell}</h1><p>{verdict}: this cell's evidence is not kept in "
            "the site (built with --evidence failing, which keeps failing, crashing, hanging "
            "and erroring cells only). The run folder has it.</p></body></html>\n")


def _copy_run(folder: Path, dest: Path, kind: str, records, evidence: str) -> None:
    """Copy a report folder; for a matrix run with ``evidence='failing'``, the folders of
    cells that passed or skipped are left out and a page in each says so (the run's own
    report links them)."""
    if evidence == "all" or kind != "matrix":
        shutil.copytree(folder, dest, copy_function=_link_or_copy, symlinks=True)
        return
    left_out = {c.folder: c for c in records if c.kind == "cell" and c.folder
                and c.verdict not in KEPT_VERDICTS}
    root = Path(folder).resolve()

    def ignore(where: str, names: list[str]) -> list[str]:
        rel = Path(where).resolve().relative_to(root)
        return [n for n in names if (rel / n).as_posix() in left_out]
    shutil.copytree(folder, dest, copy_function=_link_or_copy, symlinks=True, ignore=ignore)
    for rel, c in left_out.items():
        (dest / rel).mkdir(parents=True, exist_ok=True)
        (dest / rel / "index.html").write_text(NOT_KEPT.format(cell=pages.esc(c.cell_id),
                                                               verdict=c.verdict))


def build_site(folders: list[Path], out: Path, *, history: Path | None = None,
               evidence: str = "all") -> tuple[Site, list[str]]:
    """Write the site to ``out``; returns (what it shows, broken internal links)."""
    if evidence not in EVIDENCE:
        raise HistoryError(f"--evidence {evidence!r}: one of {', '.join(EVIDENCE)}")
    out = Path(out)
    records = store.read(history) if history is not None else []
    held = {r.key for r in records}
    folders_in_site: dict[str, str] = {}
    for folder in folders:
        folder = Path(folder)
        kind = ingest.kind_of(folder)
        found = ingest.records_from(folder)
        if not found:
            raise HistoryError(f"{folder}: nothing to file")
        run_id = found[0].run_id
        rel = f"{SECTION[kind]}/{pages.slug(run_id)}"
        dest = out / rel
        if dest.exists():
            shutil.rmtree(dest)
        _copy_run(folder, dest, kind, found, evidence)
        cells.render_transcripts(out, dest)  # before the listings, so they link the pages
        _index_directories(dest)
        for r in found:
            folders_in_site.setdefault(r.run_id, rel)
            if r.key not in held:
                held.add(r.key)
                records.append(r)
    site = Site.from_records(records)
    site.run_folders = folders_in_site
    out.mkdir(parents=True, exist_ok=True)
    (out / "index.html").write_text(pages.index(site))
    (out / "builds.html").write_text(pages.builds_index(site))
    (out / "fuzz.html").write_text(pages.fuzz_page(site))
    (out / "bench.html").write_text(pages.bench_page(site))
    (out / "bisect.html").write_text(pages.bisect_page(site))
    (out / "suite.html").write_text(pages.suite_page(site))
    for sub in ("cells", "builds"):
        (out / sub).mkdir(exist_ok=True)
    for cell_id in site.by_cell:
        (out / "cells" / f"{pages.slug(cell_id)}.html").write_text(
            cells.cell_page(site, out, cell_id))
    for name in site.builds:
        (out / "builds" / f"{pages.slug(name)}.html").write_text(pages.build_page(site, name))
    return site, broken_links(out)
