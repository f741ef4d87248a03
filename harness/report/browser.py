"""Look at a report the way a person does: in a real headless Chromium.

``check_report(matrix.html)`` renders a copy of the page with a small script that records
where every verdict glyph (``.glyph``) landed, takes a screenshot of the whole page, and
checks what is on it:

* the page's rendered text has no "nan" / "None" / "undefined" where a value belongs, and
  every ``expect_text`` (e.g. each skip reason) is in it;
* every glyph region has ink (not blank: a glyph no font can draw may render as nothing);
* no glyph region is a *box*, the hollow rectangle Chromium draws for a missing glyph
  (".notdef"): its ink hugs the border of its bounding box and leaves the inside empty.

Each returns a problem string; an empty list means the page reads as intended.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..strictness import strict

REQUIRE_ENV = "GGML_RPC_HARNESS_REQUIRE_CHROMIUM"
WIDTH = 1400
_TIMEOUT = 60.0
# A full matrix page is ~60,000 px tall: its screenshot takes longer than a minute on two
# cores, so the bound grows with the height (60 s more per 10,000 px).
_TIMEOUT_PER_PX = 60.0 / 10_000
_BOXES_ID = "ggml-rpc-glyph-boxes"
# Measures every glyph after layout; the dump then carries the boxes as JSON.
_MEASURE = f"""<script>
window.addEventListener('load', () => {{
  // the page's width as it first shows; a glyph inside a closed <details> (past its summary)
  // is not shown until a reader opens it, so it is not measured here
  const width = document.documentElement.scrollWidth;
  const shown = e => {{ const d = e.closest('details');
                       return !d || d.open || e.closest('summary') !== null; }};
  const boxes = [...document.querySelectorAll('.glyph')].filter(shown).map(e => {{
    const r = e.getBoundingClientRect();
    return {{x: r.left + scrollX, y: r.top + scrollY, w: r.width, h: r.height,
             verdict: e.dataset.verdict || e.textContent}};
  }});
  const pre = document.createElement('pre');
  pre.id = '{_BOXES_ID}';
  pre.style.display = 'none';
  pre.textContent = JSON.stringify({{boxes, height: document.documentElement.scrollHeight,
                                     width, text: document.body.innerText}});
  document.body.appendChild(pre);
}});
</script>"""
_MISSING_VALUE = re.compile(r"(?<![\w-])(nan|NaN|None|undefined|null)(?![\w-])")


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _chromium(args: list[str], url: str,
              timeout: float = _TIMEOUT) -> subprocess.CompletedProcess:
    exe = find_chromium()
    if exe is None:
        raise FileNotFoundError("no chromium on PATH (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="ggml-rpc-chromium-") as profile:
        cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu",
               "--disable-background-networking", "--hide-scrollbars",
               "--force-device-scale-factor=1", f"--user-data-dir={profile}", *args, url]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)


@dataclass
class Rendered:
    boxes: list[dict]
    height: int
    text: str
    image: np.ndarray  # H x W x 3, uint8
    screenshot: Path
    width: int = 0  # the page's width as it first shows (its <details> closed)


def render(html_path: Path, screenshot: Path, width: int = WIDTH) -> Rendered:
    """Render ``html_path`` (a copy with the measuring script) and screenshot all of it."""
    from PIL import Image

    html_path = Path(html_path).resolve()
    page = html_path.read_text()
    probe = html_path.with_name(f".{html_path.stem}.check.html")  # same dir: relative links
    probe.write_text(page.replace("</body>", _MEASURE + "</body>") if "</body>" in page
                     else page + _MEASURE)
    try:
        url = probe.as_uri()
        dump = _chromium([f"--window-size={width},1000", "--dump-dom"], url)
        m = re.search(rf"<pre id=\"{_BOXES_ID}\"[^>]*>(.*?)</pre>", dump.stdout, re.S)
        if m is None:
            raise RuntimeError(f"chromium did not run the page's script (rc={dump.returncode}):"
                               f" {dump.stderr.strip()[-500:]}")
        import html as html_mod
        data = json.loads(html_mod.unescape(m.group(1)))
        height = max(int(data["height"]), 200)
        shot = _chromium([f"--window-size={width},{height}", f"--screenshot={screenshot}"], url,
                         timeout=_TIMEOUT + _TIMEOUT_PER_PX * height)
        if not Path(screenshot).is_file():
            raise RuntimeError(f"chromium wrote no screenshot (rc={shot.returncode}): "
                               f"{shot.stderr.strip()[-500:]}")
    finally:
        probe.unlink(missing_ok=True)
    image = np.asarray(Image.open(screenshot).convert("RGB"))
    return Rendered(data["boxes"], height, data["text"], image, Path(screenshot),
                    int(data.get("width") or 0))


def width_problems(r: Rendered, window: int) -> list[str]:
    """A page a reader must scroll sideways in a ``window`` px wide browser."""
    return [f"the page is {r.width} px wide in a {window} px window"] if r.width > window \
        else []


def ink_mask(region: np.ndarray) -> np.ndarray:
    """Pixels that differ clearly from the region's background (its most common colour).
    Rows and columns inked from edge to edge are a neighbouring background or border the
    region caught, not part of a glyph: they are cleared."""
    flat = region.reshape(-1, 3)
    colours, counts = np.unique(flat, axis=0, return_counts=True)
    background = colours[counts.argmax()].astype(int)
    mask = np.abs(region.astype(int) - background).sum(axis=2) > 90
    mask[mask.all(axis=1), :] = False
    mask[:, mask.all(axis=0)] = False
    return mask


def looks_like_box(mask: np.ndarray) -> bool:
    """True for a hollow rectangle: ink covers most of its bounding box's border and
    little of its inside (the .notdef glyph)."""
    ys, xs = np.nonzero(mask)
    if len(ys) == 0:
        return False
    box = mask[ys.min():ys.max() + 1, xs.min():xs.max() + 1]
    h, w = box.shape
    if h < 5 or w < 4:
        return False
    edges = [box[0, :], box[-1, :], box[:, 0], box[:, -1]]
    # a stroke may be two pixels wide: take the better of the outer and next-inner line
    edges2 = [box[1, :], box[-2, :], box[:, 1], box[:, -2]]
    cover = min(max(a.mean(), b.mean()) for a, b in zip(edges, edges2))
    inside = box[2:-2, 2:-2]
    fill = inside.mean() if inside.size else 1.0
    return cover > 0.75 and fill < 0.2


def glyph_problems(r: Rendered) -> list[str]:
    problems = []
    if not r.boxes:
        return ["no verdict glyphs (.glyph) on the page"]
    for i, b in enumerate(r.boxes):
        x0, y0 = int(b["x"]), int(b["y"])
        x1, y1 = int(np.ceil(b["x"] + b["w"])), int(np.ceil(b["y"] + b["h"]))
        region = r.image[max(y0, 0):y1, max(x0, 0):x1]
        name = f"glyph {i} ({b.get('verdict')}) at {x0},{y0}"
        if region.size == 0 or b["w"] < 2 or b["h"] < 2:
            problems.append(f"{name}: not laid out ({b['w']:.0f}x{b['h']:.0f} px)")
            continue
        mask = ink_mask(region)
        if mask.mean() < 0.03:
            problems.append(f"{name}: blank (nothing drawn)")
        elif looks_like_box(mask):
            problems.append(f"{name}: a box, the missing-glyph shape")
    return problems


def text_problems(r: Rendered, expect_text: list[str] = ()) -> list[str]:
    problems = [f"rendered text shows a missing value: ...{r.text[max(m.start() - 40, 0):m.end() + 40]!r}..."
                for m in _MISSING_VALUE.finditer(r.text)][:5]
    flat = " ".join(r.text.split())
    problems += [f"rendered text lacks {t!r}" for t in expect_text
                 if " ".join(t.split()) not in flat]
    return problems


def check_report(html_path: Path, screenshot: Path | None = None,
                 expect_text: list[str] = (), fit_width: int | None = None) -> list[str]:
    """Problems a reader of ``html_path`` would see (empty: none). ``screenshot`` keeps the
    PNG (default: next to the page as matrix.png); ``fit_width``: the page must also fit a
    window that wide without scrolling sideways."""
    html_path = Path(html_path)
    screenshot = Path(screenshot or html_path.with_suffix(".png"))
    rendered = render(html_path, screenshot, width=fit_width or WIDTH)
    return text_problems(rendered, list(expect_text)) + glyph_problems(rendered) + (
        width_problems(rendered, fit_width) if fit_width else [])


def chromium_required() -> bool:
    """A missing browser fails rather than skips: asked for, or strict (CI)."""
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0") or strict()
