"""Look at a matrix run's matrix.html in headless Chromium, as CI's last step.

    .venv/bin/python .ci/check_report.py [RUN_DIR]   (default: the newest reports/run-*)

Fails (exit 1) when a verdict glyph is blank or a missing-glyph box, a value shows as
"nan"/"None", or a skip reason of the run is not on the page; the screenshot is kept as
RUN_DIR/matrix.png.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from harness.report.browser import check_report


def main(argv: list[str]) -> int:
    if argv:
        run_dir = Path(argv[0])
    else:
        runs = sorted(Path("reports").glob("run-*/matrix.html"), key=lambda p: p.stat().st_mtime)
        if not runs:
            print("check_report: no reports/run-*/matrix.html", file=sys.stderr)
            return 1
        run_dir = runs[-1].parent
    rows = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()
            if line.strip()]
    reasons = sorted({r["reason"] for r in rows if r.get("verdict") == "skip" and r.get("reason")})
    problems = check_report(run_dir / "matrix.html", expect_text=reasons)
    for p in problems:
        print(f"check_report: {run_dir / 'matrix.html'}: {p}", file=sys.stderr)
    print(f"check_report: {len(rows)} cells, {len(reasons)} skip reasons, "
          f"{'OK' if not problems else f'{len(problems)} problem(s)'}; "
          f"screenshot {run_dir / 'matrix.png'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
