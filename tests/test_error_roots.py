"""Every exception class of the harness derives from harness.errors.HarnessError, and every one
of a package with a root derives from that package's root, so a caller can catch any error of
the harness, or of one package, with one clause. The walk imports every module of the tree:
a new module or package cannot slip past it."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import types

import pytest

import harness
from harness.bisect.search import BisectError
from harness.capture.errors import CaptureError
from harness.conformance.cases import ConformanceError
from harness.errors import HarnessError
from harness.fuzz.errors import FuzzError
from harness.history.errors import HistoryError
from harness.impls.errors import ImplError
from harness.matrix.errors import MatrixError
from harness.pr.check import PrError
from harness.proto.errors import ProtocolError
from harness.reference.errors import ReferencePeerError
from harness.transport.base import TransportError

PACKAGE_ROOTS = {
    "harness.proto": ProtocolError, "harness.reference": ReferencePeerError,
    "harness.transport": TransportError, "harness.impls": ImplError,
    "harness.fuzz": FuzzError, "harness.matrix": MatrixError, "harness.capture": CaptureError,
    "harness.conformance": ConformanceError, "harness.bisect": BisectError,
    "harness.history": HistoryError, "harness.pr": PrError,
}
SKIPPED_MODULES = ("harness.__main__",)  # runs the CLI when imported


def all_modules() -> list[types.ModuleType]:
    return [importlib.import_module(info.name)
            for info in pkgutil.walk_packages(harness.__path__, "harness.")
            if info.name not in SKIPPED_MODULES]


def defined_errors(modules) -> list[tuple[str, type]]:
    """Exception classes defined in ``modules`` (interrupts, such as supervisor.Terminated for
    SIGTERM, are BaseException: control flow rather than errors)."""
    return sorted(((f"{mod.__name__}.{name}", obj) for mod in modules
                   for name, obj in vars(mod).items()
                   if inspect.isclass(obj) and issubclass(obj, Exception)
                   and obj.__module__ == mod.__name__), key=lambda x: x[0])


def strays(modules, roots: dict[str, type] = PACKAGE_ROOTS) -> list[str]:
    out = []
    for name, cls in defined_errors(modules):
        if not issubclass(cls, HarnessError):
            out.append(f"{name}: not a HarnessError")
            continue
        package = next((p for p in sorted(roots, key=len, reverse=True)
                        if name.startswith(p + ".")), None)
        if package is not None and not issubclass(cls, roots[package]):
            out.append(f"{name}: not a {roots[package].__name__}")
    return out


def test_every_module_is_walked():
    names = {m.__name__ for m in all_modules()}
    for package in PACKAGE_ROOTS:
        assert package in names
    assert {"harness.fuzz.libfuzzer.engine", "harness.fuzz.rdma.worker", "harness.cli",
            "harness.scenario"} <= names


def test_every_error_has_the_harness_root_and_its_package_root():
    assert not strays(all_modules())


@pytest.mark.parametrize("base, expected", [
    (Exception, "not a HarnessError"), (HarnessError, "not a FuzzError"), (FuzzError, None)])
def test_a_stray_error_is_found(base, expected):
    planted = types.ModuleType("harness.fuzz.planted")
    planted.Stray = type("Stray", (base,), {"__module__": "harness.fuzz.planted"})
    found = strays([planted])
    assert found == ([f"harness.fuzz.planted.Stray: {expected}"] if expected else [])
