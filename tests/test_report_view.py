"""Reports a person reads: the HTML in a real headless Chromium (glyphs drawn, no boxes, no
"nan", every skip reason shown), the terminal grid at 80 columns, `harness peers list`.

The browser tests need Chromium; without it they skip, and where
GGML_RPC_HARNESS_REQUIRE_CHROMIUM=1 (CI) they fail instead. Each check is also shown
failing on a planted fault.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from harness.report import browser
from harness.report.glyphs import VERDICTS
from harness.report.html_report import outcome_text, text
from harness.report.terminal import print_summary
from harness.strictness import TOOL_MISSING
from needs import skip
from harness.report.writers import write_all

SKIP_REASON = "p9 is not built: run `harness peers build p9`"


def _row(i: int, verdict: str, **kw) -> dict:
    pairs = [("old-client", "old-server"), ("old-client", "new-server"),
             ("new-client", "old-server"), ("new-client", "new-server")]
    cr, sr = pairs[i % 4]
    client, server = ("ref-7" if cr.startswith("old") else "llama-9"), \
        ("ref-7" if sr.startswith("old") else "llama-9")
    row = {
        "run_id": "t", "cell_id": f"d:{client}_{server}:s{i}", "design": "bump",
        "pair": f"{cr}/{sr}", "client_role": cr, "server_role": sr, "client": client,
        "server": server, "client_label": f"{cr.split('-')[0]} client: {client}",
        "server_label": f"{sr.split('-')[0]} server: {server}", "client_dialect": "7.0.0",
        "server_dialect": "9.0.0", "client_kind": "ref", "server_kind": "pin",
        "cache": i % 2 == 0, "scenario": f"s{i}", "transport": "tcp", "expected": "works",
        "expected_outcome": "works", "because": "", "observed": "works", "verdict": verdict,
        "reason": verdict, "duration": 1.5 + i, "folder": f"bump/x/s{i}", "degraded": [],
        "rejected_by": None, "message": "", "checks": [], "facts": {},
        "load": {"set_tensor_calls": 4, "set_tensor_bytes": (i + 1) << 21, "hash_calls": 1,
                 "hash_hits": 1, "bytes_hashed": 1 << 21, "upload_span": 0.25 * (i + 1),
                 "hashing_seconds": 0.1, "wire_seconds": 0.05, "gap_seconds": 0.01,
                 "commands": {}},
    }
    row.update(kw)
    return row


def sample_rows() -> list[dict]:
    """One cell of every verdict, a rejection with its message, a skip with no outcome."""
    return [
        _row(0, "pass"),
        _row(1, "pass", observed="rejected-at-hello", rejected_by="client",
             message="RPC server version mismatch: 9.0.0", expected_outcome="rejected-at-hello"),
        _row(2, "fail", observed="works-degraded", degraded=["server cache never used"],
             reason="expected works, observed works-degraded"),
        _row(3, "crash", observed="failed", reason="server died: SIGSEGV"),
        _row(4, "hang", observed=None, reason="no byte on the wire for 30 s"),
        _row(5, "error", observed=None, reason="server did not start: image missing"),
        _row(6, "skip", observed=None, reason=SKIP_REASON, load={}),
        _row(7, "skip", observed=None, reason=SKIP_REASON, load={}),
    ]


def test_missing_values_are_empty_text_and_rejections_say_who_rejected_whom():
    assert text(None) == "" and text(float("nan")) == "" and text("x") == "x"
    r = sample_rows()[1]
    assert outcome_text(r) == ("rejected at HELLO: client ref-7 rejected server llama-9: "
                               "RPC server version mismatch: 9.0.0")
    assert outcome_text(sample_rows()[2]) == "works, degraded: server cache never used"


def test_html_has_reasons_front_table_and_no_nan(tmp_path):
    write_all(sample_rows(), tmp_path, "t")
    page = (tmp_path / "matrix.html").read_text()
    # a DataFrame turns the skipped cells' None outcome into NaN: it must not show as "nan"
    assert not re.search(r">\s*nan\s*<|\bnan\b", page)
    assert SKIP_REASON.replace("`", "") in page.replace("`", "")
    assert "upload span" in page and "hashing" in page and "wall" in page
    assert "client ref-7 rejected server llama-9: RPC server version mismatch: 9.0.0" in page
    for v in VERDICTS:
        assert f"data-verdict='{v}'" in page
    assert "💥" not in page and "⏳" not in page  # emoji: boxes in a browser without the font


def test_terminal_grid_fits_80_columns():
    console = Console(width=80, record=True, force_terminal=False)
    df = pd.DataFrame(sample_rows())
    print_summary(console, df, tmp_dir := __import__("pathlib").Path("run"))
    out = console.export_text()
    assert all(len(line) <= 80 for line in out.splitlines()), out
    assert "client \\ server" in out and "old: ref-7" in out
    assert SKIP_REASON in " ".join(out.split()) and "nan" not in out
    assert f"{tmp_dir}/matrix.html" in out
    # one grid row per client, not a row per scenario
    grid_rows = [ln for ln in out.splitlines() if ln.startswith(("│old:", "│new:"))]
    assert len(grid_rows) == 2, out


# ------------------------------------------------------------------ pixel checks, no browser
def _canvas(h=15, w=10) -> np.ndarray:
    return np.full((h, w, 3), 255, dtype=np.uint8)


def test_box_detector_tells_a_missing_glyph_box_from_a_drawn_glyph():
    box = _canvas()
    box[2, 2:8] = box[12, 2:8] = 0
    box[2:13, 2] = box[2:13, 7] = 0
    assert browser.looks_like_box(browser.ink_mask(box))
    tick = _canvas()
    for i in range(6):
        tick[10 - i, 2 + i] = 0
    assert not browser.looks_like_box(browser.ink_mask(tick))
    filled = _canvas()
    filled[3:12, 2:8] = 0
    assert not browser.looks_like_box(browser.ink_mask(filled))


# ---------------------------------------------------------------------- real Chromium
def _chromium_or_skip():
    if browser.find_chromium() is None:
        if browser.chromium_required():
            pytest.fail(f"{browser.REQUIRE_ENV} is set (or CI is strict) but there is no "
                        "chromium on PATH")
        skip(TOOL_MISSING, "no chromium on PATH (Debian: apt-get install chromium)")


@pytest.fixture
def report(tmp_path):
    _chromium_or_skip()
    write_all(sample_rows(), tmp_path, "t")
    return tmp_path / "matrix.html"


def test_report_renders_every_glyph_and_reason_in_chromium(report):
    problems = browser.check_report(report, expect_text=[SKIP_REASON, "9.0.0"])
    assert problems == []
    assert report.with_suffix(".png").stat().st_size > 0


def test_a_glyph_from_a_missing_font_is_caught(report):
    page = report.read_text()
    # the planted fault: the crash glyph as the emoji the report used to print
    svg = re.search(r"<svg class='glyph' data-verdict='crash'.*?</svg>", page).group(0)
    report.write_text(page.replace(svg, "<span class='glyph' data-verdict='crash'>💥</span>", 1))
    problems = browser.check_report(report)
    assert any("(crash)" in p and "box" in p for p in problems), problems


def test_a_blank_glyph_and_a_nan_are_caught(report):
    page = report.read_text()
    svg = re.search(r"<svg class='glyph' data-verdict='hang'.*?</svg>", page).group(0)
    page = page.replace(svg, "<svg class='glyph' data-verdict='hang' width='14' height='14'>"
                             "</svg>", 1)
    report.write_text(page.replace(SKIP_REASON, "nan"))
    problems = browser.check_report(report, expect_text=[SKIP_REASON])
    assert any("(hang)" in p and "blank" in p for p in problems), problems
    assert any("missing value" in p for p in problems), problems
    assert any("lacks" in p for p in problems), problems


# --------------------------------------------------------------------- harness peers list
def test_peers_list_reads_at_80_columns_and_paths_are_whole(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from harness.cli import app
    from harness.impls import registry

    cache = tmp_path / "cache"
    monkeypatch.setenv(registry.CACHE_ENV, str(cache))
    # a built-looking p7 entry: the manifest the registry accepts
    pin = registry.get_pin("p7")
    pin.bin_dir.mkdir(parents=True)
    (pin.bin_dir / "ggml-rpc-server").write_text("")
    (pin.entry_dir / registry.MANIFEST_NAME).write_text(__import__("json").dumps({
        "format": registry.MANIFEST_FORMAT, "pin": {"name": "p7"}, "verified_proto": "7.0.0",
        "files": ["ggml-rpc-server"], "targets": ["ggml-rpc-server"]}))
    runner = CliRunner()
    table = runner.invoke(app, ["peers", "list"], env={"COLUMNS": "80"})
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert all(len(line) <= 80 for line in lines), table.output
    p7 = next(line for line in lines if line.startswith("│ p7"))
    assert "llama.cpp-0.3.36" in p7 and pin.key in p7 and "…" not in table.output
    paths = runner.invoke(app, ["peers", "list", "--paths"], env={"COLUMNS": "80"})
    assert f"p7\t{pin.bin_dir}" in paths.output.splitlines()
    assert "p3\t-" in paths.output.splitlines()
