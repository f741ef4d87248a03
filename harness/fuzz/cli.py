"""Bodies of ``harness fuzz`` and ``harness replay`` (the typer layer only parses options)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from .target import TargetError

CLIENT_PREFIX = "client:"


def fuzz_command(console: Console, *, target: str, dialect: str | None, duration: str,
                 seed: int | None, workers: int, out: Path | None, deadline: float,
                 rss_limit: int, as_limit: int, corpus: Path | None, shrink_seconds: float,
                 max_steps: int, keep_work: bool, fail_on_findings: bool = False,
                 engine: str = "live") -> int:
    """Run a campaign and print where its report is. Exit status 0: findings are results,
    unless ``fail_on_findings`` (then 1 if anything was found)."""
    from .display import LiveProgress, parse_duration

    try:
        seconds = parse_duration(duration)
    except ValueError as e:
        console.print(f"[red]{e}")
        return 2
    if engine not in ("live", "libfuzzer"):
        console.print(f"[red]unknown engine {engine!r}: live or libfuzzer")
        return 2
    if engine == "libfuzzer":
        from .libfuzzer.engine import LibFuzzerConfig, run_libfuzzer_campaign
        cfg = LibFuzzerConfig(target=target, duration=seconds, seed=seed, workers=workers,
                              out=out, deadline=deadline, rss_limit=rss_limit,
                              as_limit=as_limit, corpus=corpus, keep_work=keep_work)
        def runner(cfg, on_progress):  # the first use builds the target: say so
            return run_libfuzzer_campaign(cfg, on_progress=on_progress, progress_build=lambda
                                          line: console.print(line, highlight=False))
    elif target.startswith(CLIENT_PREFIX):
        from .client import ClientCampaignConfig, run_client_campaign
        cfg = ClientCampaignConfig(peer=target[len(CLIENT_PREFIX):], duration=seconds, seed=seed,
                                   out=out, step_timeout=max(deadline, 5.0))
        runner = run_client_campaign
    else:
        from .campaign import CampaignConfig, run_campaign
        cfg = CampaignConfig(target=target, dialect=dialect, duration=seconds, seed=seed,
                             workers=workers, out=out, deadline=deadline, rss_limit=rss_limit,
                             as_limit=as_limit, corpus=corpus, shrink_seconds=shrink_seconds,
                             max_steps=max_steps, keep_work=keep_work)
        runner = run_campaign
    try:
        with LiveProgress(console, target, seconds) as live:
            folder, report = runner(cfg, on_progress=live.update)
    except TargetError as e:
        console.print(f"[red]{e}")
        return 2
    console.print((folder / "report.md").read_text(), markup=False, highlight=False,
                  soft_wrap=True)
    console.print(f"report: {folder}/report.md", highlight=False, soft_wrap=True)
    return 1 if fail_on_findings and not report.get("nothing_found") else 0


def replay_command(console: Console, file: Path, *, target: str, dialect: str | None,
                   deadline: float) -> int:
    try:
        if target.startswith(CLIENT_PREFIX):
            from .client import replay_client_finding
            result = replay_client_finding(file, target[len(CLIENT_PREFIX):])
        else:
            from .replay import replay
            result = replay(file, target, dialect=dialect, deadline=deadline)
    except (TargetError, OSError, ValueError, KeyError) as e:
        console.print(f"[red]cannot replay {file}: {e}", highlight=False)
        return 2
    console.print(result.summary(), markup=False, highlight=False, soft_wrap=True)
    return 1 if result.reproduced else 0
