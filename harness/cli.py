"""The ``harness`` command line. Each command parses its options and calls one module."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Protocol test harness and interoperability matrix for ggml-rpc.")
console = Console()


@app.callback()
def _root() -> None:
    """Protocol test harness and interoperability matrix for ggml-rpc."""


@app.command()
def dialects():
    """List the protocol dialects the codec and the reference peer speak."""
    from .proto import DIALECTS, PRIMARY

    t = Table("dialect", "version", "commands", "HELLO caps", "server flags", "cache_flag",
              "graph uid", "evidence")
    for d in DIALECTS.values():
        t.add_row(("* " if d.name in PRIMARY else "  ") + d.name, d.version_str, str(len(d.ids)),
                  _yn(d.hello_caps), _yn(d.server_flags), _yn(d.cache_flag), _yn(d.graph_uid),
                  d.evidence)
    console.print(t)
    console.print("* = primary dialects (held to byte-exactness)")


def _yn(b: bool) -> str:
    return "yes" if b else "-"


def main() -> None:
    app()


if __name__ == "__main__":
    main()
