"""Every internal link of a static site resolves: the file exists, and a ``#fragment`` names
an element of the page it points to. External links (a scheme or ``//``) are not followed:
the site must not need the network."""

from __future__ import annotations

from collections.abc import Iterable
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import typer

MAX_PAGE = 64 << 20  # a page larger than this is not one the site writes


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if value is None:
                continue
            if name == "id":
                self.ids.add(value)
            elif (name == "href" and tag != "use") or (name == "src"):
                self.links.append(value)


def _parse(path: Path) -> _Links:
    p = _Links()
    if path.stat().st_size <= MAX_PAGE:
        p.feed(path.read_text(encoding="utf-8", errors="replace"))
    return p


def broken_links(site: Path, skip: Iterable[str] = ()) -> list[str]:
    """'page: link (why)' for every internal link of ``site``'s pages that does not resolve.
    Pages named in ``skip`` (paths relative to ``site``) are link targets but their own links
    are not checked."""
    site = Path(site).resolve()
    pages = {p: _parse(p) for p in site.rglob("*.html") if not p.name.startswith(".")}
    skipped = {(site / s).resolve() for s in skip}
    problems = []
    for page, parsed in sorted(pages.items()):
        if page in skipped:
            continue
        for link in parsed.links:
            parts = urlsplit(link)
            if parts.scheme or link.startswith("//"):
                continue
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            where = f"{page.relative_to(site)}: {link}"
            if not target.is_relative_to(site):
                problems.append(f"{where} (outside the site)")
            elif not target.exists():
                problems.append(f"{where} (no such file)")
            elif target.is_dir() and not (target / "index.html").is_file():
                problems.append(f"{where} (a directory without index.html: a static host "
                                "lists none)")
            elif parts.fragment and target.is_file() and target.suffix == ".html":
                ids = (pages.get(target) or _parse(target)).ids
                if unquote(parts.fragment) not in ids:
                    problems.append(f"{where} (no id {parts.fragment!r} there)")
    return problems


def check(site: Path = typer.Argument(..., help="A folder of built HTML pages."),
          skip: list[str] = typer.Option([], "--skip", help="A page (relative to SITE) whose own "
                                         "links are not checked, e.g. 404.html, whose links "
                                         "are root-absolute by design.")) -> None:
    """Print every internal link of a built static site (the results site, the documentation
    site) that does not resolve; exit 1 if there is one, 2 if SITE holds no pages."""
    pages = list(site.rglob("*.html")) if site.is_dir() else []
    if not pages:
        typer.echo(f"{site}: no HTML pages there", err=True)
        raise typer.Exit(2)
    problems = broken_links(site, skip)
    for problem in problems:
        typer.echo(problem)
    typer.echo(f"{site}: {len(pages)} pages, {len(problems)} broken internal link(s)")
    raise typer.Exit(1 if problems else 0)


if __name__ == "__main__":  # python -m harness.site.links SITE [--skip PAGE]...
    typer.run(check)
