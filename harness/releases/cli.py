"""``harness releases``: the builds each package offers, what is known of them here, and their
equivalence classes."""

from __future__ import annotations

import json
from collections.abc import Iterable

from rich.console import Console
from rich.table import Column, Table

from ..impls.build import build_pin
from ..impls.catalogue import Build, builds_between, classes, list_builds, newest, scan
from ..impls.errors import BuildError, ImplError
from ..impls.packages import RECIPES
from ..impls.progress import RichBuildProgress

# short names of the digest's parts, for the "changed" column
_PART_NAMES = {"ggml/src/ggml-rpc/ggml-rpc.cpp": "ggml-rpc.cpp", "ggml/include/ggml-rpc.h":
               "ggml-rpc.h", "ggml/include/ggml.h#enum ggml_op": "ops",
               "ggml/include/ggml.h#enum ggml_type": "types"}


def changed_parts(before: Build | None, after: Build) -> list[str]:
    """The digest parts that differ between two builds (their files, shortly named)."""
    if before is None or before.digest is None or after.digest is None or \
            before.digest.kind != after.digest.kind or before.klass == after.klass:
        return []
    a, b = before.digest.parts, after.digest.parts
    names = sorted({k for k in set(a) | set(b) if a.get(k) != b.get(k)})
    return [_PART_NAMES.get(n, n.rsplit("/", 1)[-1]) for n in names]


def _date(build: Build) -> str:
    return (build.file.upload_time or "")[:10] if build.file else "-"


def _proto(build: Build) -> str:
    if not build.proto:
        return build.problem and "no RPC" or "?"
    return build.proto + ("" if build.proto_from == "wire" else "*")


def build_table(builds: list[Build], title: str) -> Table:
    # the key column stays whole at 80 columns (no_wrap); the others fold first, so a narrow
    # terminal shows every value on more lines rather than "b107…"
    fold = {h: Column(h, overflow="fold") for h in ("llama.cpp", "uploaded", "class", "commit",
                                                     "changed")}
    t = Table(Column("build", no_wrap=True), fold["llama.cpp"], fold["uploaded"],
              Column("proto", no_wrap=True), fold["class"], Column("built", no_wrap=True),
              fold["commit"], fold["changed"], title=title,
              caption="proto* read from ggml-rpc.h, not yet verified on the wire; changed: RPC "
                      "files that differ from the previous class", caption_justify="left")
    previous = None
    for b in builds:
        changed = changed_parts(previous, b)
        t.add_row(b.name, f"b{b.build_number}" if b.build_number is not None else "-", _date(b),
                  _proto(b), b.klass or ("-" if b.problem else "?"), "yes" if b.built else "-",
                  (b.commit or "-")[:10], ", ".join(changed))
        if b.digest is not None:
            previous = b
    return t


def summary_table(per_package: dict[str, list[Build]]) -> Table:
    t = Table(Column("package", no_wrap=True), "builds", "versions (newest uploaded)", "built",
              "read", "classes", "protos seen")
    for package, builds in per_package.items():
        listed = [b for b in builds if b.file is not None]
        protos = sorted({b.proto for b in builds if b.proto}, key=lambda v: tuple(
            int(x) for x in v.split(".")))
        scanned = [b for b in builds if b.digest is not None]
        versions = f"{builds[0].version} .. {builds[-1].version}" if builds else "-"
        if listed:
            versions += f" ({_date(listed[-1])})"
        t.add_row(package, str(len(builds)), versions, str(sum(b.built for b in builds)),
                  str(len(scanned)), str(len(classes(scanned))) if scanned else "-",
                  f"{protos[0]} .. {protos[-1]}" if len(protos) > 1 else "".join(protos) or "-")
    return t


def class_spans(builds: list[Build]) -> list[dict]:
    """Consecutive runs of one class: what a matrix or bisect over these builds would run."""
    spans: list[dict] = []
    for b in builds:
        if b.klass is None:
            continue
        if spans and spans[-1]["class"] == b.klass:
            spans[-1]["last"] = b.spec
            spans[-1]["builds"] += 1
        else:
            spans.append({"class": b.klass, "first": b.spec, "last": b.spec, "builds": 1,
                          "proto": b.proto})
    return spans


def _scan_with_progress(console: Console, builds: Iterable[Build], workers: int) -> None:
    todo = [b for b in builds if b.digest is None and b.problem is None and b.file is not None]
    if not todo:
        return
    console.print(f"reading {len(todo)} archives ({sum(b.file.size or 0 for b in todo) / 1e9:.1f}"
                  " GB to download; nothing is kept)", highlight=False)
    count = [0]

    def show(b: Build, seconds: float) -> None:
        count[0] += 1
        console.print(f"  [{count[0]}/{len(todo)}] {b.spec}: {_proto(b)} class "
                      f"{b.klass or b.problem} ({seconds:.1f} s)", highlight=False, markup=False)
    scan(todo, workers=workers, progress=show)


def releases_command(console: Console, packages: list[str], *, between: tuple[str, str] | None,
                     newest_only: bool, digest: bool, build: bool, as_json: bool,
                     offline: bool, workers: int) -> int:
    unknown = [p for p in packages if p not in RECIPES]
    if unknown:
        console.print(f"[red]not a package with llama.cpp builds: {', '.join(unknown)} (known: "
                      f"{', '.join(RECIPES)})", highlight=False)
        return 2
    try:
        if between:
            per_package = {}
            found = builds_between(*between)
            per_package[found[0].package] = found
        elif newest_only:
            per_package = {p: [newest(p)] for p in packages or RECIPES}
        else:
            per_package = {p: list_builds(p, offline=offline) for p in packages or RECIPES}
    except ImplError as e:
        console.print(f"[red]{e}", highlight=False)
        return 2
    failed = False
    if digest or build:
        for builds in per_package.values():
            _scan_with_progress(console, builds, workers)
    if build:
        progress = RichBuildProgress(console)
        for builds in per_package.values():
            for b in builds:
                try:
                    built = build_pin(b.spec, progress=progress)
                except (BuildError, ImplError) as e:
                    console.print(f"[red]{b.spec} does not build:[/red] {e}", highlight=False)
                    failed = True
                    continue
                b.built, b.proto, b.proto_from = True, built.manifest["verified_proto"], "wire"
    if as_json:
        print(json.dumps({p: {"builds": [b.to_dict() for b in bs], "spans": class_spans(bs),
                              "classes": len(classes(bs))}
                          for p, bs in per_package.items()}, indent=1))
        return 1 if failed else 0
    detailed = bool(between or newest_only or packages)
    if detailed:
        for package, builds in per_package.items():
            console.print(build_table(builds, package))
            scanned = [b for b in builds if b.klass]
            no_rpc = sum(1 for b in builds if b.problem)
            if scanned or no_rpc:
                console.print(f"{package}: {len(scanned) + no_rpc} of {len(builds)} builds read"
                              f" ({no_rpc} without RPC), {len(classes(scanned))} equivalence "
                              f"classes, {len(class_spans(builds))} runs of one class",
                              highlight=False)
    else:
        console.print(summary_table(per_package))
        console.print("`harness releases PACKAGE` lists every build; --digest reads the "
                      "archives' RPC sources (classes), --between A B a range", highlight=False)
    return 1 if failed else 0
