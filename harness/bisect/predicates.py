"""What ``harness bisect`` asks of each build: one predicate per option.

Each predicate builds the probed build when it is not cached (a build that fails, or a tree
without the RPC backend, is a skip, as ``git bisect skip``), runs its question against it
and gives a short result string; results are compared for equality only.

* ``--cell SLUG``: a matrix cell with the build in one of its roles (the server by default):
  the observed outcome (``works``, ``rejected-at-hello by client``, ``crash``, ...), not the
  verdict, since the cell's expectation was written for its own implementations;
* ``--repro FILE``: a saved fuzz reproducer replayed against the build's server:
  ``reproduced``, ``no failure`` or ``another failure`` (an abort with the saved file and
  message reproduces at any line: builds move code);
* ``--differential``: a fixed set of generated sessions (seed, count) run against the build
  and the reference of its dialect, with the dialect's shipped allow-list: ``agrees`` /
  ``diverges``;
* ``--run CMD``: a shell command with the build in its environment: its exit status (125
  means "cannot test this build", as for ``git bisect run``).

``classes_apply`` says whether two builds of one equivalence class must give the same result:
true for questions about the wire (cell, differential), for a reproducer whose fault lies in
the RPC code, and for ``--run`` only when asked; a crash inside a CPU kernel can differ
between builds with the same RPC sources.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..impls.build import build_pin
from ..impls.catalogue import find_build, scan
from ..impls.digest import NoRpcSources
from ..impls.errors import BuildError, ImplError
from ..impls.registry import get_peer
from .search import PredicateAnswer

SKIP_EXIT = 125  # git bisect run's "cannot test this build"
# a reproducer whose fault site names one of these lies in code the RPC digest covers
_RPC_SITES = re.compile(r"ggml-rpc|rpc-server|rpc_server|transport\.(?:cpp|h)")


class Predicate(Protocol):
    kind: str
    classes_apply: bool

    def describe(self) -> str: ...

    def __call__(self, build: str) -> PredicateAnswer: ...


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def ensure_built(build: str, progress=None) -> tuple[float, PredicateAnswer | None]:
    """(seconds spent building, None) when the build is ready; (seconds, skip) when it does
    not build or does not speak RPC."""
    t0 = time.monotonic()
    try:
        result = build_pin(build, progress=progress)
    except NoRpcSources as e:
        return time.monotonic() - t0, PredicateAnswer(None, skipped=f"does not speak RPC: "
                                                            f"{_first_line(e)}")
    except (BuildError, ImplError) as e:
        return time.monotonic() - t0, PredicateAnswer(None, skipped=f"does not build: {_first_line(e)}")
    return (0.0 if result.cached else time.monotonic() - t0), None


def build_class(build: str) -> str | None:
    """The equivalence class of a registry build (its archive is read once if need be)."""
    entry = find_build(build)
    if entry.digest is None:
        scan([entry])
    return entry.klass


def _proto_of(build: str) -> str | None:
    try:
        peer = get_peer(build)
    except ImplError:
        return None
    return peer.verified_proto or peer.proto or None


@dataclass
class _Built:
    """The part every predicate shares: build first, then ask."""

    progress: object = None

    def __call__(self, build: str) -> PredicateAnswer:
        seconds, skipped = ensure_built(build, self.progress)
        if skipped is not None:
            return dataclasses.replace(skipped, build_seconds=seconds)
        out = self.ask(build)
        return dataclasses.replace(out, proto=out.proto or _proto_of(build),
                                   build_seconds=seconds)

    def ask(self, build: str) -> PredicateAnswer:  # pragma: no cover - each predicate defines it
        raise NotImplementedError


# ------------------------------------------------------------------ --cell
def cell_result(row: dict) -> PredicateAnswer:
    """A matrix row as a bisect result: the observed outcome, crash or hang; a harness error
    or a skip means the build could not be judged."""
    verdict = row["verdict"]
    if verdict in ("crash", "hang"):
        return PredicateAnswer(verdict, detail=row.get("reason", ""))
    if verdict in ("error", "skip"):
        return PredicateAnswer(None, skipped=f"cell {verdict}: {row.get('reason', '')}")
    observed = row["observed"]
    if observed == "rejected-at-hello":
        result = f"rejected-at-hello by {row.get('rejected_by') or 'either side'}"
    elif observed == "works-degraded":
        result = f"works-degraded ({', '.join(row.get('degraded') or [])})"
    else:
        result = observed
    return PredicateAnswer(result, detail=row.get("message") or row.get("reason", ""))


@dataclass
class CellPredicate(_Built):
    matrix: object = None
    cell: object = None  # harness.matrix.cells.Cell
    role: str = "server"  # the role the probed build takes
    out: Path = Path("reports")
    kind: str = "cell"
    classes_apply: bool = True

    def describe(self) -> str:
        return f"cell {self.cell.id}, the build as its {self.role}"

    def ask(self, build: str) -> PredicateAnswer:
        from ..impls.adapters import adapter_for_peer
        from ..matrix.execute import Timeouts, plan, run_cell
        job = plan(self.matrix, [self.cell])[0]
        probe = adapter_for_peer(build)
        if self.role == "server":
            cell = dataclasses.replace(self.cell, server=build)
            job = dataclasses.replace(job, cell=cell, server=probe)
        else:
            cell = dataclasses.replace(self.cell, client=build)
            job = dataclasses.replace(job, cell=cell, client=probe, client_knobs=None)
        timeouts = Timeouts(self.matrix.defaults.deadline, self.matrix.defaults.idle_timeout)
        run_dir = self.out / "probes" / _folder(build)
        row = run_cell(job, run_dir, timeouts, run_id=f"bisect-{_folder(build)}")
        return dataclasses.replace(cell_result(row), proto=probe.dialect)


# ------------------------------------------------------------------ --repro
def reproducer_in_rpc_code(path: Path) -> bool:
    """True when the reproducer's saved fault site lies in code the RPC digest covers."""
    from ..fuzz.replay import load
    _, signature, _ = load(path)
    return signature is not None and bool(_RPC_SITES.search(signature.line or ""))


@dataclass
class ReproPredicate(_Built):
    path: Path = Path()
    deadline: float = 5.0
    kind: str = "repro"
    classes_apply: bool = False

    def __post_init__(self):
        self.classes_apply = reproducer_in_rpc_code(self.path)

    def describe(self) -> str:
        return f"does {self.path} reproduce"

    def ask(self, build: str) -> PredicateAnswer:
        from ..fuzz.replay import replay_outcome
        from ..fuzz.errors import TargetError
        try:
            result, r = replay_outcome(self.path, build, deadline=self.deadline)
        except (TargetError, OSError) as e:
            return PredicateAnswer(None, skipped=f"cannot replay: {_first_line(e)}")
        return PredicateAnswer(result, detail=r.observed.title() if r.observed else "the target survived")


# ------------------------------------------------------------------ --differential
@dataclass
class DifferentialPredicate(_Built):
    sessions: int = 300
    seed: int = 0
    out: Path = Path("reports")
    max_seconds: float = 600.0
    kind: str = "differential"
    classes_apply: bool = True

    def describe(self) -> str:
        return (f"the build against the reference of its dialect, {self.sessions} sessions "
                f"of seed {self.seed}, the dialect's shipped allow-list")

    def ask(self, build: str) -> PredicateAnswer:
        from ..fuzz.allow_list import shipped_allow_list
        from ..fuzz.differential import DifferentialConfig, run_differential
        from ..fuzz.target_spec import TargetSpec
        from ..fuzz.errors import TargetError
        try:
            dialect = TargetSpec.parse(build).dialect
        except TargetError as e:
            return PredicateAnswer(None, skipped=f"cannot start: {_first_line(e)}")
        if dialect is None:
            return PredicateAnswer(None, skipped="no dialect of the table speaks its proto")
        cfg = DifferentialConfig(a=build, b=f"ref-{dialect}", dialect=dialect, seed=self.seed,
                                 max_cases=self.sessions, duration=self.max_seconds,
                                 out=self.out / "probes" / _folder(build),
                                 allow=shipped_allow_list(dialect), shrink_seconds=10.0)
        _, report = run_differential(cfg)
        if report["errors"]:
            return PredicateAnswer(None, skipped=f"differential error: {report['errors'][0]['error']}")
        if report["cases"] < self.sessions:
            return PredicateAnswer(None, skipped=f"ran {report['cases']} of {self.sessions} sessions "
                                         f"in {self.max_seconds:g} s")
        found = report["findings"]
        titles = sorted({f.get("title") or f.get("signature", {}).get("kind", "?")
                         for f in found})
        return PredicateAnswer("diverges" if found else "agrees", proto=dialect,
                       detail="; ".join(map(str, titles))[:300])


# ------------------------------------------------------------------ --run
@dataclass
class RunPredicate(_Built):
    command: str = ""
    timeout: float = 600.0
    classes: bool = False
    kind: str = "run"
    classes_apply: bool = False

    def __post_init__(self):
        self.classes_apply = self.classes

    def describe(self) -> str:
        return f"exit status of `{self.command}`"

    def ask(self, build: str) -> PredicateAnswer:
        peer = get_peer(build)
        env = dict(os.environ, HARNESS_BUILD=build, HARNESS_BUILD_PROTO=peer.display_proto,
                   HARNESS_BUILD_BIN=str(peer.bin_dir or ""),
                   HARNESS_BUILD_SERVER=str(peer.server_binary or ""))
        # its own process group, so a timeout kills what the shell started too
        proc = subprocess.Popen(self.command, shell=True, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return PredicateAnswer(None, skipped=f"`{self.command}` ran over {self.timeout:g} s")
        finally:
            if proc.poll() is None:  # interrupted: nothing of it outlives the bisect
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        tail = output.strip().splitlines()[-1:] or [""]
        if proc.returncode == SKIP_EXIT:
            return PredicateAnswer(None, skipped=f"the command says it cannot test this build: {tail[0]}")
        return PredicateAnswer(f"exit {proc.returncode}", detail=tail[0][:200])


def _folder(build: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=+-]+", "_", build)
