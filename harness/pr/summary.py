"""What a pull-request check shows: the job summary (Markdown, GitHub's $GITHUB_STEP_SUMMARY)
and the annotations (workflow commands on stdout: ``::error file=...::message``)."""

from __future__ import annotations

import re
from pathlib import Path

from ..report.glyphs import SYMBOL
from ..report.html_report import SHORT
from .check import BREAKS, COMPATIBLE, HEADER, PR_DESIGN, PrResult

MARK = {COMPATIBLE: SYMBOL["pass"], BREAKS: SYMBOL["fail"]}
# the three pairs that involve the build (reference client and server as "old")
PAIRS = {"old-client/new-server": "reference client → {b}'s server",
         "new-client/old-server": "{b}'s client → reference server",
         "new-client/new-server": "{b}'s client → {b}'s server"}


def _md(text: object) -> str:
    """Text for one table cell or list item: one line, no table separator."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _outcome(r: dict) -> str:
    """What was observed when the verdict rests on it (pass, fail), else the verdict."""
    if r["verdict"] not in ("pass", "fail") or not r.get("observed"):
        return f"{SYMBOL[r['verdict']]} {r['verdict']}"
    return f"{SYMBOL[r['verdict']]} {SHORT.get(r['observed'], r['observed'])}"


def render(result: PrResult) -> str:
    b = result.build
    name = b.name if b else "the pull request's build"
    out = [f"## {MARK.get(result.exit_code, SYMBOL['error'])} ggml-rpc harness: {name}", "",
           f"**{_md(result.headline)}**", ""]
    if b is not None:
        out += _facts(result)
    if result.problems:
        out += ["### Could not test", ""] + [f"- {_md(p)}" for p in result.problems] + [""]
    if result.unexpected:
        out += ["### Unexpected verdicts", ""]
        for r in result.unexpected:
            where = PAIRS.get(r["pair"], r["pair"]).format(b=name) \
                if r["design"] == PR_DESIGN else f"{r['client']} client → {r['server']} server"
            out.append(f"- **{r['verdict'].upper()}** `{r['cell_id']}` ({where}, "
                       f"{r['scenario']}, server cache {'on' if r['cache'] else 'off'}): "
                       f"{_md(r['reason'])}")
        out.append("")
    if result.divergences:
        out += [f"### Differential divergences from {result.differential['b']}", ""]
        for d in result.divergences:
            out.append(f"- **{_md(d['title'])}** `{d['id']}`: {_md(d['detail'])} "
                       f"(`{_md(d['replay'])}`)")
        out.append("")
    out += _grids(result, name)
    if result.notes:
        out += ["### Notes", ""] + [f"- {_md(n)}" for n in result.notes] + [""]
    folders = [Path(p).name for p in (result.run_dir, result.diff_dir, result.site_dir) if p]
    if folders:
        out += [f"In the report folder: {', '.join(f'`{f}/`' for f in folders)} (every cell's "
                "transcripts and logs, the differential's reproducers, the results site), "
                "`pr.json`, `pr.md`.", ""]
    return "\n".join(out) + "\n"


def _facts(result: PrResult) -> list[str]:
    b = result.build
    built = b.how + (f" from `{b.source_dir}`" if b.source_dir else "") + \
        (f" at {b.commit[:12]}" if b.commit else "")
    base = f"{result.base_version} ({result.base_from})" if result.base_version \
        else f"not given; {b.version} has {'a' if b.known else 'no'} row in the dialect table: " \
             f"judged as {'a bump' if result.bumped else 'no bump'}"
    counts: dict[str, int] = {}
    for r in result.rows:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    rows = [("build", f"`{b.name}`, {built}"), ("announces", b.version), ("base", base),
            ("held to", f"ref-{b.dialect} and the released builds "
                        f"{', '.join(result.against) or '(none)'}"),
            ("cells", f"{len(result.rows)}: " + ", ".join(f"{n} {v}" for v, n in counts.items())
             if result.rows else "none ran")]
    d = result.differential
    if d is not None:
        rows.append(("differential", f"{d['cases']} sessions in {d['seconds']} s against "
                                     f"{d['b']}, allow-list {d['allow_list'] or 'built-in only'}: "
                                     f"{len(d['divergences'])} divergence(s)"))
    return ["| | |", "|---|---|", *(f"| {k} | {_md(v)} |" for k, v in rows), ""]


def _grids(result: PrResult, name: str) -> list[str]:
    out: list[str] = []
    design = [r for r in result.rows if r["design"] == PR_DESIGN]
    if design:
        pairs = [p for p in PAIRS if any(r["pair"] == p for r in design)]
        out += [f"### Against the reference of {result.build.version}", "",
                "| scenario | server cache | " + " | ".join(PAIRS[p].format(b=name)
                                                         for p in pairs) + " |",
                "|---|---" + "|---" * len(pairs) + "|"]
        keys = list(dict.fromkeys((r["scenario"], r["cache"]) for r in design))
        for scenario, cache in keys:
            cells = []
            for p in pairs:
                r = next((r for r in design if (r["scenario"], r["cache"], r["pair"])
                          == (scenario, cache, p)), None)
                cells.append(_outcome(r) if r else "")
            out.append(f"| {scenario} | {'on' if cache else 'off'} | " + " | ".join(cells) + " |")
        out.append("")
    releases = [r for r in result.rows if r["design"] != PR_DESIGN]
    if releases:
        out += ["### Against the released builds (observed, predicted by the version rule)", "",
                f"| build | {name}'s client → its server | its client → {name}'s server |",
                "|---|---|---|"]
        for other in dict.fromkeys([*result.against, name]):
            to = next((r for r in releases if (r["client"], r["server"]) == (name, other)), None)
            back = next((r for r in releases if (r["client"], r["server"]) == (other, name)),
                        None)
            if to is None and back is None:
                continue
            out.append(f"| {other} ({(to or back)['server_dialect' if to else 'client_dialect']})"
                       f" | {_release(to)} | {_release(back) if other != name else '(same)'} |")
        out.append("")
    return out


def _release(r: dict | None) -> str:
    if r is None:
        return ""
    predicted = SHORT.get(r["expected_outcome"], r["expected_outcome"])
    return f"{_outcome(r)} ({predicted})"


# ------------------------------------------------------------------ annotations

def _data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _prop(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")


def _command(level: str, message: str, *, title: str, file: str | None = None,
             line: int | None = None) -> str:
    props = [f"file={_prop(file)}"] if file else []
    if file and line:
        props.append(f"line={line}")
    props.append(f"title={_prop(title)}")
    return f"::{level} {','.join(props)}::{_data(message)}"


def _version_line(source_dir: str | None, workspace: Path | None) -> tuple[str | None, int | None]:
    """ggml-rpc.h of the tree, as a path the workflow's checkout knows, and the line its
    version is defined on (where a bump would go); (None, None) outside the workspace."""
    if source_dir is None:
        return None, None
    header = Path(source_dir).resolve() / HEADER
    base = (workspace or Path.cwd()).resolve()
    if not header.is_relative_to(base):
        return None, None
    try:
        text = header.read_text(errors="replace").splitlines()
    except OSError:
        return None, None
    line = next((i for i, t in enumerate(text, 1)
                 if re.match(r"\s*#define\s+RPC_PROTO_MAJOR_VERSION\b", t)), None)
    return header.relative_to(base).as_posix(), line


def annotations(result: PrResult, workspace: Path | None = None) -> list[str]:
    """One workflow command per unexpected verdict, divergence and problem, on the line of the
    tree's ggml-rpc.h that defines the version (the line a bump changes), then the headline."""
    b = result.build
    file, line = _version_line(b.source_dir if b else None, workspace)
    out = []
    for r in result.unexpected:
        level = "warning" if result.bumped and r["design"] == PR_DESIGN else "error"
        out.append(_command(level, f"{r['verdict']}: {r['reason']}", file=file, line=line,
                            title=f"ggml-rpc {r['cell_id']}"))
    for d in result.divergences:
        out.append(_command("warning" if result.bumped else "error",
                            f"{d['title']}: {d['detail']} (replay: {d['replay']})", file=file,
                            line=line, title=f"ggml-rpc differential {d['id']}"))
    for p in result.problems:
        out.append(_command("error", p, title="ggml-rpc: could not test"))
    level = {COMPATIBLE: "notice", BREAKS: "error"}.get(result.exit_code, "error")
    out.append(_command(level, result.headline, file=file, line=line, title="ggml-rpc harness"))
    return out
