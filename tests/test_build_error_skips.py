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


# ------------------------------------------------------------------ a peer whose build failed
def _p7_cell_skip(monkeypatch, cache):
    from harness.impls.adapters import Adapter
    from harness.matrix.execute import PlannedCell, cell_skip
    monkeypatch.setenv("GGML_RPC_HARNESS_CACHE", str(cache))
    job = PlannedCell(cell=None, expect=None, client=Adapter("ref-7", "ref", "7.0.0"),
                      server=Adapter("llama-7", "pin", "7.0.0", pin="p7"))
    return cell_skip(job)


def test_a_peer_whose_build_failed_is_a_build_error_not_a_missing_peer(monkeypatch, tmp_path):
    """A pin whose build failed left its log in the cache (harness.impls.build keeps it); its
    cells were `peer-missing`, which `--allow-skip peer-missing` accepted. Planted: the same
    cache without the log, the peer only unbuilt: still peer-missing."""
    from harness.impls.cache import failed_build_log, forget_failed_builds, logs_dir
    from harness.impls.registry import resolve_pin
    from harness.scenario import PEER_MISSING
    cache = tmp_path / "cache"
    cache.mkdir()
    unbuilt = _p7_cell_skip(monkeypatch, cache)
    assert unbuilt.code == PEER_MISSING  # the planted side: nothing failed, nothing built
    key = resolve_pin("p7").key
    logs_dir().mkdir(parents=True)
    log = logs_dir() / f"{key}.build.log"
    log.write_text("error: expected ';' before '}' token\n")
    (logs_dir() / f"{key}+asan.build.log").write_text("another entry's log\n")
    failed = _p7_cell_skip(monkeypatch, cache)
    assert failed.code == BUILD_ERROR and str(log) in failed.reason, failed
    assert not AllowSkip.parse([PEER_MISSING, "p7"]).allows(
        {"verdict": "skip", "skip_code": failed.code, "reason": failed.reason,
         "skip_missing": failed.missing})
    # a build that succeeds later forgets the failure (only its own entry's logs)
    forget_failed_builds(key)
    assert failed_build_log(key) is None and (logs_dir() / f"{key}+asan.build.log").exists()
    assert _p7_cell_skip(monkeypatch, cache).code == PEER_MISSING
