"""A build error is never a skip any run accepts: a soft verbs device that does not compile
makes every rdma-soft cell a ``build-error`` skip (it was ``device-missing``, which
``--allow-skip device-missing`` or a reason substring turned green), which no --allow-skip
accepts and which strict mode refuses."""

from __future__ import annotations

import pytest

from harness import strictness
from harness.matrix import rdma_soft
from harness.matrix.skips import AllowSkip, exit_code
from harness.scenario import BUILD_ERROR, DEVICE_MISSING, NOT_APPLICABLE
from harness.transport.softverbs import SoftverbsBuildError, build_softverbs

# a macro that breaks the device's source: a real compile error from the real compiler
BROKEN = ("sv_capture=(",)


def test_a_compile_error_of_the_device_is_a_build_error(tmp_path):
    with pytest.raises(SoftverbsBuildError, match="softverbs compile failed"):
        build_softverbs(defines=BROKEN, out_dir=tmp_path)


def _broken_device(monkeypatch, tmp_path):
    monkeypatch.setattr(rdma_soft, "build_softverbs",
                        lambda: build_softverbs(defines=BROKEN, out_dir=tmp_path))


def test_the_rdma_soft_cells_of_a_broken_device_skip_as_build_errors(monkeypatch, tmp_path):
    _broken_device(monkeypatch, tmp_path)
    skip = rdma_soft.unavailable("pin", "ref")
    assert skip is not None and skip.code == BUILD_ERROR and skip.missing == "softverbs"
    assert "softverbs compile failed" in skip.reason
    # a kind with no rdma-soft form is still not applicable, whatever the device does
    assert rdma_soft.unavailable("docker", "pin").code == NOT_APPLICABLE


def test_a_missing_compiler_is_a_missing_device_not_a_build_error(monkeypatch):
    monkeypatch.setattr(rdma_soft, "build_softverbs",
                        lambda: build_softverbs(cc="no-such-cc"))
    assert rdma_soft.unavailable("pin", "pin").code == DEVICE_MISSING


def _row(code: str, reason: str = "softverbs compile failed (cc ...): error") -> dict:
    return {"verdict": "skip", "skip_code": code, "reason": reason, "skip_missing": "softverbs"}


def test_no_allow_skip_accepts_a_build_error():
    everything = AllowSkip.parse([BUILD_ERROR, DEVICE_MISSING, "softverbs", "compile failed"])
    assert not everything.allows(_row(BUILD_ERROR))
    assert exit_code([_row(BUILD_ERROR)], everything) == 1
    # planted: the label it had, device-missing, any of those would have accepted
    for item in (DEVICE_MISSING, "softverbs", "compile failed"):
        assert AllowSkip.parse([item]).allows(_row(DEVICE_MISSING))


def test_strict_mode_never_allows_a_build_error(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert not strictness.allowed(BUILD_ERROR) and not strictness.allowed("pyverbs-missing")
    assert strictness.refusal(strictness.coded(BUILD_ERROR, "softverbs")) is not None
