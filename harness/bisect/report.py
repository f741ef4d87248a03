"""bisect.json and bisect.md: the probe table and the answer."""

from __future__ import annotations

import json
from pathlib import Path

from .search import BisectResult, Probe

FORMAT = "ggml-rpc-bisect/1"


def to_json(result: BisectResult, *, package: str, question: str, kind: str,
            elapsed: float) -> dict:
    return {"format": FORMAT, "package": package, "question": question, "predicate": kind,
            "elapsed_s": round(elapsed, 1), **result.to_dict()}


def _row(p: Probe) -> str:
    result = p.result if p.result is not None else "-"
    how = p.status + (f" from {p.inferred_from}" if p.inferred_from else "")
    seconds = f"{p.seconds:.1f}" + (f" (build {p.build_seconds:.0f})" if p.build_seconds else "")
    detail = (p.detail or "").replace("|", "\\|").replace("\n", " ")[:120]
    return (f"| {p.build} | {p.klass or '?'} | {p.proto or '?'} | {how} | {result} | "
            f"{seconds} | {detail} |")


def render_markdown(data: dict, probes: list[Probe]) -> str:
    lines = [f"# bisect {data['good']} .. {data['bad']}", "",
             f"Question: {data['question']}.", "",
             f"- {data['good']}: **{data['good_result']}**; {data['bad']}: "
             f"**{data['bad_result']}**"]
    if data["first_different"]:
        lines.append(f"- first build whose result differs: **{data['first_different']}**, "
                     f"after {data['last_same']}")
    lines.append(f"- {data['measured']} builds measured of {data['spanned']} spanned"
                 f"{'; equivalence classes used' if data['classes_used'] else ''}; "
                 f"{data['elapsed_s']} s in all")
    lines += [f"- note: {n}" for n in data["notes"]]
    lines += ["", "| build | class | proto | probe | result | seconds | detail |",
              "|---|---|---|---|---|---|---|"]
    lines += [_row(p) for p in sorted(probes, key=lambda p: p.index)]
    return "\n".join(lines) + "\n"


def write(out: Path, data: dict, probes: list[Probe]) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "bisect.json", out / "bisect.md"
    json_path.write_text(json.dumps(data, indent=1) + "\n")
    md_path.write_text(render_markdown(data, probes))
    return json_path, md_path
