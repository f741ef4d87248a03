"""Server code a corpus reached: lines and functions of ggml-rpc.cpp and the ggml files behind it.

The pin's coverage build (``harness.fuzz.libfuzzer.build``, flavour ``coverage``: clang's
``-fprofile-instr-generate -fcoverage-mapping`` and the harness's replay driver) runs every
input of a corpus once, each in a forked child that writes its profile even when it aborts;
``llvm-profdata-16 merge`` and ``llvm-cov-16`` turn the profile into

* ``coverage/lcov.info`` and ``coverage/html/index.html`` (llvm-cov's own report),
* ``coverage/summary.json`` -- per file lines and functions covered, and the functions of
  ggml-rpc.cpp no input reached (what :func:`render_coverage_markdown` puts in report.md).

Either engine's corpus works: the in-process one (raw inputs) directly, a live campaign's
``corpus/*.rpct`` after conversion (:func:`case_inputs`)::

    python -m harness.fuzz.coverage p7 reports/fuzz-x/corpus --out reports/fuzz-x/coverage
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..impls.supervisor import REAL_PROCESS_ENV

RPC_FILE = "ggml-rpc.cpp"
# Files of the harness itself, the C++ library and the system: not server code.
IGNORE = r"(rpc_server_fuzzer\.cpp|replay_main\.c|^/usr/)"
TOP_FILES = 12
# The server side of ggml-rpc.cpp (the file holds the client too, which no server input runs).
SERVER_FUNCTION = re.compile(r"^(?:rpc_server::|rpc_serve_client|recv_msg|send_msg|"
                             r"ggml_backend_rpc_start_server|deserialize_tensor)")


def case_inputs(src: Path, folder: Path) -> int:
    """A live campaign's ``.rpct`` cases as raw inputs in ``folder``."""
    from .libfuzzer.corpus import import_live_corpus
    return import_live_corpus(src, folder)


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace", check=True,
                          **kw)


def corpus_coverage(pin: str, inputs: list[Path], out: Path, *, timeout: float = 10.0) -> dict:
    """Replay ``inputs`` (folders of raw inputs or of ``.rpct`` cases) on the coverage build
    of ``pin``; write lcov, HTML and summary.json to ``out``; return the summary."""
    from .libfuzzer.build import build_target, tool
    build = build_target(pin, "coverage")
    manifest = build.manifest
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="harness-cov-") as tmp:
        raw = Path(tmp) / "inputs"
        raw.mkdir()
        n_inputs = 0
        for folder in inputs:
            folder = Path(folder)
            if not folder.is_dir():
                continue
            if any(folder.glob("*.rpct")):
                n_inputs += case_inputs(folder, raw)
            for f in folder.iterdir():
                if f.is_file() and f.suffix != ".rpct":
                    shutil.copyfile(f, raw / f.name)
                    n_inputs += 1
        profraw = Path(tmp) / "cov-%1m.profraw"
        env = dict(os.environ, LLVM_PROFILE_FILE=str(profraw), **REAL_PROCESS_ENV,
                   HARNESS_REPLAY_TIMEOUT=str(int(timeout)))
        env.pop("HARNESS_FUZZ_EVENTS", None)
        nice = shutil.which("nice")
        run = _run(([nice] if nice else []) + [str(build.binary), str(raw)], env=env,
                   timeout=max(600.0, n_inputs * timeout))
        profiles = [str(p) for p in Path(tmp).glob("cov-*.profraw")]
        if not profiles:
            raise OSError(f"the coverage build wrote no profile ({run.stdout.strip()})")
        profdata = out / "corpus.profdata"
        _run([tool("llvm-profdata"), "merge", "-sparse", *profiles, "-o", str(profdata)])
    cov = tool("llvm-cov")
    common = [str(build.binary), f"-instr-profile={profdata}", f"-ignore-filename-regex={IGNORE}"]
    source_root = manifest.get("source_root")
    if source_root and manifest.get("kept_sources"):
        # The build tree is gone; the entry keeps ggml's sources for llvm-cov to read.
        kept = build.entry / manifest["kept_sources"] / "ggml"
        common.append(f"-path-equivalence={source_root}/ggml,{kept}")
    lcov = _run([cov, "export", "-format=lcov", *common]).stdout
    (out / "lcov.info").write_text(_relative_paths(lcov, source_root, build.entry))
    html = out / "html"
    shutil.rmtree(html, ignore_errors=True)
    _run([cov, "show", "-format=html", f"-output-dir={html}", "-show-line-counts-or-regions",
          *common])
    data = json.loads(_run([cov, "export", "-format=text", *common]).stdout)
    summary = summarise(data, n_inputs=n_inputs, replay_output=run.stdout.strip())
    summary.update({"pin": pin, "lcov": str(out / "lcov.info"),
                    "html": str(html / "index.html")})
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def _relative_paths(lcov: str, source_root: str | None, entry: Path) -> str:
    """lcov with source paths relative to the llama.cpp tree (no machine paths in reports)."""
    out = lcov
    for prefix in filter(None, (f"{source_root}/" if source_root else None,
                                f"{entry / 'src'}/")):
        out = out.replace(f"SF:{prefix}", "SF:")
    return out


def _short(path: str) -> str:
    m = re.search(r"(ggml/(?:src|include)/.*)$", path)
    return m.group(1) if m else Path(path).name


def summarise(export: dict, *, n_inputs: int = 0, replay_output: str = "") -> dict:
    """llvm-cov's JSON export reduced to per-file lines/functions and ggml-rpc.cpp's misses."""
    files = []
    server: dict[str, bool] = {}  # server-side function of ggml-rpc.cpp -> reached
    for d in export.get("data", []):
        for f in d.get("files", []):
            s = f["summary"]
            files.append({"file": _short(f["filename"]),
                          "lines_covered": s["lines"]["covered"], "lines": s["lines"]["count"],
                          "functions_covered": s["functions"]["covered"],
                          "functions": s["functions"]["count"]})
        for fn in d.get("functions", []):
            if not any(Path(x).name == RPC_FILE for x in fn.get("filenames", [])):
                continue
            name = re.sub(r"\(.*$", "", _demangled(fn["name"]))
            if SERVER_FUNCTION.match(name):
                server[name] = server.get(name, False) or fn.get("count", 0) > 0
    files.sort(key=lambda x: (Path(x["file"]).name != RPC_FILE, -x["lines_covered"]))
    total = {k: sum(f[k] for f in files) for k in ("lines_covered", "lines",
                                                  "functions_covered", "functions")}
    rpc = next((f for f in files if Path(f["file"]).name == RPC_FILE), None)
    return {"inputs": n_inputs, "replay": replay_output, "files": files, "total": total,
            "rpc": rpc, "server_functions": len(server),
            "server_functions_reached": sum(server.values()),
            "rpc_unreached_functions": sorted(k for k, v in server.items() if not v)}


def _demangled(name: str) -> str:
    # llvm-cov names static functions "file.cpp:name"; the rest are mangled C++ names.
    name = name.split(":", 1)[-1] if re.match(r"^[^:]+\.(?:c|cpp):", name) else name
    filt = shutil.which("llvm-cxxfilt-16") or shutil.which("c++filt")
    if filt and name.startswith("_Z"):
        try:
            return subprocess.run([filt, name], capture_output=True, text=True,
                                  timeout=10).stdout.strip() or name
        except (OSError, subprocess.SubprocessError):
            return name
    return name


def _pct(a: int, b: int) -> str:
    return f"{100.0 * a / b:.1f}%" if b else "-"


def render_coverage_markdown(summary: dict | None) -> list[str]:
    """The report.md section: the table of server files, and ggml-rpc.cpp's unreached functions."""
    if not summary:
        return []
    if "error" in summary:
        return ["## Server code coverage", "", f"Not measured: {summary['error']}", ""]
    lines = ["## Server code coverage", "",
             f"The corpus ({summary['inputs']} inputs) replayed by the pin's coverage build "
             "(clang -fprofile-instr-generate -fcoverage-mapping, llvm-cov-16): lcov "
             "`coverage/lcov.info`, HTML `coverage/html/index.html`.", "",
             "| file | lines covered | functions covered |", "|---|---|---|"]
    for f in summary["files"][:TOP_FILES]:
        lines.append(f"| `{f['file']}` | {f['lines_covered']:,} / {f['lines']:,} "
                     f"({_pct(f['lines_covered'], f['lines'])}) | {f['functions_covered']} / "
                     f"{f['functions']} ({_pct(f['functions_covered'], f['functions'])}) |")
    t = summary["total"]
    lines.append(f"| all {len(summary['files'])} files | {t['lines_covered']:,} / {t['lines']:,} "
                 f"({_pct(t['lines_covered'], t['lines'])}) | {t['functions_covered']} / "
                 f"{t['functions']} ({_pct(t['functions_covered'], t['functions'])}) |")
    lines.append("")
    missed = summary.get("rpc_unreached_functions") or []
    lines += [f"Server functions of `{RPC_FILE}` reached: "
              f"{summary.get('server_functions_reached', 0)} of "
              f"{summary.get('server_functions', 0)}" + (
                  "; not reached: " + ", ".join(f"`{m}`" for m in missed) if missed else "")
              + " (the file's client side is not counted).", ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.fuzz.coverage",
                                 description="Server code coverage of a corpus.")
    ap.add_argument("pin")
    ap.add_argument("inputs", nargs="+", type=Path, help="folders of inputs or .rpct cases")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    summary = corpus_coverage(args.pin, args.inputs, args.out)
    print("\n".join(render_coverage_markdown(summary)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
