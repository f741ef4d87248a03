"""The version rule as a model: predict accept/reject for any pair of released builds."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..proto.dialects import client_accepts, get_dialect
from .model import Expectation


def predict(client_dialect: str, server_dialect: str) -> Expectation:
    c, s = get_dialect(client_dialect), get_dialect(server_dialect)
    if c.hello_caps != s.hello_caps:
        # proto 3 sends an empty HELLO and expects 3 bytes back; >= 4 sends and expects more.
        return Expectation(outcome="rejected-at-hello", side="server",
                           because=f"HELLO layouts differ ({c.version_str}: "
                                   f"{'24' if c.hello_caps else '0'}-byte request, "
                                   f"{s.version_str}: {'24' if s.hello_caps else '0'}-byte); the "
                                   "server closes on the size mismatch")
    if not client_accepts(c.version, s.version):
        return Expectation(outcome="rejected-at-hello", side="client",
                           message=f"version mismatch: {s.version_str}",
                           because=f"version rule: {c.version_str} client refuses {s.version_str} "
                                   "(major differs or server minor is newer)")
    return Expectation(outcome="works", because=f"version rule: {c.version_str} client accepts "
                                                 f"{s.version_str}")


@dataclass
class ReleasePeers:
    """The builds the releases design runs: one per equivalence class, and the rest."""

    run: list[str]  # peer names, in matrix.yaml order then --with order
    represented: dict[str, str] = field(default_factory=dict)  # left-out build -> its stand-in
    classes: dict[str, str | None] = field(default_factory=dict)  # build -> its class
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"run": self.run, "represented": self.represented, "classes": self.classes,
                "notes": self.notes}


def expand_with(specs: list[str]) -> list[str]:
    """``--with`` items as peer names: ``newest`` is the newest build of every package with
    llama.cpp builds; anything else a build or pin name."""
    from ..impls.catalogue import newest
    from ..impls.packages import RECIPES
    from ..impls.registry import resolve_pin
    out: list[str] = []
    for spec in specs:
        names = [newest(p).name for p in RECIPES] if spec == "newest" else \
            [resolve_pin(spec).name]
        out += [n for n in names if n not in out]
    return out


def release_peers(base: list[str], extra: list[str] = (), *,
                  klass=None) -> ReleasePeers:
    """``base`` (matrix.yaml's releases peers) plus ``extra``, one per equivalence class:
    builds of one class cannot differ on the wire, so a class's first build stands in for the
    others. ``klass(name)`` gives a build's class (None: unknown, the build runs; default:
    ``catalogue.local_class``, which never reads the index)."""
    from ..impls.registry import resolve_pin
    if klass is None:  # what this machine knows: a matrix run downloads nothing for classes
        from ..impls.catalogue import local_class as klass
    names = list(dict.fromkeys([*base, *(resolve_pin(e).name for e in extra)]))
    out = ReleasePeers(run=[])
    stand_in: dict[str, str] = {}
    for name in names:
        try:
            k = klass(name)
        except Exception as e:  # noqa: BLE001 - no index, no archive: it simply runs
            k = None
            out.notes.append(f"{name}: class unknown ({str(e).splitlines()[0]}); it runs")
        out.classes[name] = k
        if k is not None and k in stand_in:
            out.represented[name] = stand_in[k]
            out.notes.append(f"{name} is class {k}, as {stand_in[k]}: not run, represented "
                             f"by {stand_in[k]}")
            continue
        if k is not None:
            stand_in[k] = name
        out.run.append(name)
    return out
