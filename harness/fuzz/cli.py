"""Bodies of ``harness fuzz`` and ``harness replay`` (the typer layer only parses options)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from .report import DEFAULT_MIN_MESSAGES, campaign_problems
from .errors import TargetError

CLIENT_PREFIX = "client:"
RDMA_SOFT = "rdma-soft"  # the real RDMA transport over the project's soft verbs device
TRANSPORTS = ("tcp", RDMA_SOFT)


def fuzz_command(console: Console, *, target: str | None, dialect: str | None, duration: str,
                 seed: int | None, workers: int, out: Path | None, deadline: float,
                 rss_limit: int, as_limit: int, corpus: Path | None, shrink_seconds: float,
                 max_steps: int, keep_work: bool, fail_on_findings: bool = False,
                 min_messages: int = DEFAULT_MIN_MESSAGES, shard: str = "1/1",
                 differential: tuple[str, str] | None = None, allow: Path | None = None,
                 no_allow: bool = False, engine: str = "live", oracles: dict | None = None,
                 transport: str = "tcp", sweep_share: float = 0.2, phases: str = "all",
                 sweep_only: bool = False) -> int:
    """Run a campaign and print where its report is. Exit status 0: findings are results,
    unless ``fail_on_findings`` (then 1 if anything was found); 2 when the campaign could not
    test the target (it never listened, or fewer than ``min_messages`` were exchanged)."""
    from .display import LiveProgress, parse_duration

    from ..shards import parse_shard

    try:
        seconds = parse_duration(duration)
        shard_of = parse_shard(shard)
    except ValueError as e:
        console.print(f"[red]{e}")
        return 2
    if not 0.0 <= sweep_share <= 1.0:
        console.print(f"[red]--sweep-share {sweep_share}: a share of the duration, 0 to 1")
        return 2
    from .sweep import PARTS
    chosen = PARTS if phases.strip() == "all" else \
        tuple(p.strip() for p in phases.split(",") if p.strip())
    unknown = [p for p in chosen if p not in PARTS]
    if unknown or not chosen:
        console.print(f"[red]--phases {phases}: names among {', '.join(PARTS)} (or all)")
        return 2
    chosen = tuple(p for p in PARTS if p in chosen)  # the sweep's own order
    if (target is None) == (differential is None):
        console.print("[red]give either --target or --differential A B")
        return 2
    if engine not in ("live", "libfuzzer"):
        console.print(f"[red]unknown engine {engine!r}: live or libfuzzer")
        return 2
    if transport not in TRANSPORTS:
        console.print(f"[red]unknown transport {transport!r}: {' or '.join(TRANSPORTS)}")
        return 2
    if transport == RDMA_SOFT:
        if differential is not None or engine != "live" or target.startswith(CLIENT_PREFIX):
            console.print("[red]--transport rdma-soft fuzzes one server target with the live "
                          "engine (no --differential, --engine libfuzzer or client:)")
            return 2
        from .rdma.campaign import RdmaCampaignConfig, run_rdma_campaign
        cfg = RdmaCampaignConfig(target=target, duration=seconds, seed=seed, out=out,
                                 deadline=deadline, shrink_seconds=shrink_seconds,
                                 keep_work=keep_work, min_messages=min_messages,
                                 as_limit=as_limit, sweep_share=sweep_share)
        runner = run_rdma_campaign
    elif differential is not None:
        from .differential import DifferentialConfig, run_differential
        try:
            allow = default_allow(console, differential, dialect, allow, no_allow)
        except TargetError as e:
            console.print(f"[red]{e}", highlight=False)
            return 2
        cfg = DifferentialConfig(a=differential[0], b=differential[1], dialect=dialect,
                                 duration=seconds, seed=seed, out=out, deadline=deadline,
                                 rss_limit=rss_limit, as_limit=as_limit,
                                 shrink_seconds=shrink_seconds, max_steps=max_steps,
                                 allow=allow, min_messages=min_messages, keep_work=keep_work,
                                 sweep_share=sweep_share, phases=chosen,
                                 sweep_only=sweep_only)
        runner = run_differential
        target = f"{differential[0]} vs {differential[1]}"
    elif engine == "libfuzzer":
        from .libfuzzer.config import LibFuzzerConfig
        from .libfuzzer.engine import run_libfuzzer_campaign
        cfg = LibFuzzerConfig(target=target, duration=seconds, seed=seed, workers=workers,
                              out=out, deadline=deadline, rss_limit=rss_limit,
                              as_limit=as_limit, corpus=corpus, keep_work=keep_work)
        def runner(cfg, on_progress):  # the first use builds the target: say so
            return run_libfuzzer_campaign(cfg, on_progress=on_progress, progress_build=lambda
                                          line: console.print(line, highlight=False))
    elif target.startswith(CLIENT_PREFIX):
        from .client_targets import ClientCampaignConfig, run_client_campaign
        cfg = ClientCampaignConfig(peer=target[len(CLIENT_PREFIX):], duration=seconds, seed=seed,
                                   out=out, step_timeout=max(deadline, 5.0))
        runner = run_client_campaign
    else:
        from .campaign import CampaignConfig, run_campaign
        cfg = CampaignConfig(target=target, dialect=dialect, duration=seconds, seed=seed,
                             workers=workers, out=out, deadline=deadline, rss_limit=rss_limit,
                             as_limit=as_limit, corpus=corpus, shrink_seconds=shrink_seconds,
                             max_steps=max_steps, keep_work=keep_work,
                             min_messages=min_messages, shard=shard_of,
                             oracles=oracles or {}, sweep_share=sweep_share, phases=chosen,
                             sweep_only=sweep_only)
        runner = run_campaign
    try:
        with LiveProgress(console, target, seconds) as live:
            folder, report = runner(cfg, on_progress=live.update)
    except (TargetError, ValueError) as e:
        console.print(f"[red]{e}")
        return 2
    console.print((folder / "report.md").read_text(), markup=False, highlight=False,
                  soft_wrap=True)
    console.print(f"report: {folder}/report.md", highlight=False, soft_wrap=True)
    from ..history.cli import file_history
    if not file_history(console, folder):
        return 2
    problems = campaign_problems(report, min_messages)
    if problems:
        for p in problems:
            console.print(f"[red]{p}", highlight=False, soft_wrap=True)
        return 2
    return 1 if fail_on_findings and not report.get("nothing_found") else 0


def replay_command(console: Console, file: Path, *, target: str | None, dialect: str | None,
                   deadline: float, differential: tuple[str, str] | None = None,
                   allow: Path | None = None, transport: str | None = None,
                   no_allow: bool = False) -> int:
    if (target is None) == (differential is None):
        console.print("[red]give either --target or --differential A B")
        return 2
    from .rdma.replay import reproducer_path
    if transport == RDMA_SOFT or (transport is None and reproducer_path(file) is not None):
        return _replay_rdma(console, file, target, deadline=deadline)
    if transport not in (None, "tcp"):
        console.print(f"[red]unknown transport {transport!r}: {' or '.join(TRANSPORTS)}")
        return 2
    if differential is not None:
        try:
            allow = default_allow(console, differential, dialect, allow, no_allow)
        except TargetError as e:
            console.print(f"[red]{e}", highlight=False)
            return 2
        return _replay_differential(console, file, differential, dialect=dialect,
                                    deadline=deadline, allow=allow)
    try:
        if target.startswith(CLIENT_PREFIX):
            from .client_targets import replay_client_finding
            result = replay_client_finding(file, target[len(CLIENT_PREFIX):])
        else:
            from .replay import replay
            result = replay(file, target, dialect=dialect, deadline=deadline)
    except (TargetError, OSError, ValueError, KeyError) as e:
        console.print(f"[red]cannot replay {file}: {e}", highlight=False)
        return 2
    console.print(result.summary(), markup=False, highlight=False, soft_wrap=True)
    return 1 if result.reproduced else 0


def merge_command(console: Console, out: Path, folders: list[Path]) -> int:
    from .merge import MergeError, merge_campaigns

    try:
        report = merge_campaigns(out, folders)
    except MergeError as e:
        console.print(f"[red]{e}", highlight=False)
        return 2
    kept = report["corpus_merged"]
    console.print(f"merged {len(folders)} campaign(s): {report['messages_sent']:,} messages, "
                  f"{report['distinct_signatures']} signature(s), corpus {kept['entries_kept']} "
                  f"of {kept['entries_read']} entries ({kept['features']} behaviours)",
                  highlight=False)
    if report["shards_missing"]:
        console.print(f"[red]shards missing: {report['shards_missing']}", highlight=False)
    console.print(f"report: {out}/report.md", highlight=False, soft_wrap=True)
    return 1 if report["shards_missing"] else 0


def default_allow(console: Console, pair: tuple[str, str], dialect: str | None,
                  allow: Path | None, no_allow: bool) -> Path | None:
    """The allow-list a differential uses: ``allow``, else the one shipped for the pair's
    dialect (harness/data/differential), unless ``no_allow`` (the built-in entries only)."""
    from .allow_list import shipped_allow_list
    from .target_spec import TargetSpec
    if allow is not None or no_allow:
        return allow
    found = {TargetSpec.parse(t, dialect).dialect for t in pair} - {None}
    shipped = shipped_allow_list(dialect or min(found)) if (dialect or found) else None
    if shipped is not None:
        console.print(f"allow-list: {shipped} (shipped for the dialect; --no-allow for the "
                      "built-in entries only)", highlight=False)
    return shipped


def _replay_differential(console: Console, file: Path, pair: tuple[str, str], *,
                         dialect: str | None, deadline: float, allow: Path | None) -> int:
    from .differential import replay_differential

    used: list[dict] = []
    try:
        div = replay_differential(file, *pair, dialect=dialect, deadline=deadline, allow=allow,
                                  used=used)
    except (TargetError, OSError, ValueError, KeyError) as e:
        console.print(f"[red]cannot replay {file}: {e}", highlight=False)
        return 2
    if div is None and used:
        # not an agreement: a user checking whether the allow-list hides a finding must see
        # which entry let the difference pass
        console.print(f"{pair[0]} and {pair[1]} differ only as the allow-list allows: not "
                      "reproduced; allowed by", highlight=False)
        for e in {id(e): e for e in used}.values():
            console.print(f"  {e['cmd']} {e['kind']}" + (f" {e['match']!r}" if "match" in e
                                                          else "")
                          + f": {e.get('reason', '')}", markup=False, highlight=False,
                          soft_wrap=True)
        return 0
    if div is None:
        console.print(f"{pair[0]} and {pair[1]} agree: not reproduced", highlight=False)
        return 0
    console.print(f"{div.signature.title()}\n{div.detail}\nREPRODUCED", markup=False,
                  highlight=False, soft_wrap=True)
    return 1


def _replay_rdma(console: Console, file: Path, target: str | None, *, deadline: float) -> int:
    from .rdma.replay import replay_rdma

    if target is None:
        console.print("[red]--transport rdma-soft replays against one --target")
        return 2
    try:
        result = replay_rdma(file, target, deadline=deadline)
    except (TargetError, OSError, ValueError, KeyError) as e:
        console.print(f"[red]cannot replay {file}: {e}", highlight=False)
        return 2
    console.print(result.summary(), markup=False, highlight=False, soft_wrap=True)
    return 1 if result.reproduced else 0
