"""The test suite's own budget: where its time goes, run over run.

``profile`` holds the profile a run writes (per test and per fixture, in seconds, with the
area each test belongs to) and the reviewed list of tests allowed to need more than
:data:`~harness.suite.profile.SLOW_SECONDS`; ``plugin`` is the pytest plugin that writes the
profile (``pytest --suite-profile DIR``) and keeps tests that share an expensive fixture on one
xdist worker; ``cli`` is ``harness suite``.
"""
