"""The version rule as a model: predict accept/reject for any pair of released builds."""

from __future__ import annotations

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
