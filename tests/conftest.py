"""Shared test configuration.

Hypothesis profiles: ``ci`` (the default) keeps the whole suite fast; ``thorough`` is for
nightly or pre-release runs. Pick one with ``HYPOTHESIS_PROFILE=thorough pytest ...``.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

from harness.impls.supervisor import exit_on_sigterm

# Deadlines are off in both profiles: example timing on shared CI machines is too noisy, and
# the framing properties deliberately feed inputs one byte at a time.
settings.register_profile("ci", max_examples=100, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# A cancelled run (SIGTERM) unwinds the tests' finally blocks, which stop the real servers.
exit_on_sigterm()
