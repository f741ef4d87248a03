"""Every exception class of harness.proto, harness.reference, harness.transport and
harness.impls derives from its package's root, so a caller can catch any error of one
package with one clause."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import types

import pytest

import harness.impls
import harness.reference
import harness.proto
import harness.transport
from harness.impls.errors import ImplError
from harness.reference.errors import PeerError
from harness.proto.errors import ProtocolError
from harness.transport.base import TransportError

ROOTS = [(harness.proto, ProtocolError), (harness.reference, PeerError),
         (harness.transport, TransportError), (harness.impls, ImplError)]


def strays(modules, root: type) -> list[str]:
    """Exception classes defined in ``modules`` that do not derive from ``root`` (interrupts,
    such as supervisor.Terminated for SIGTERM, are control flow rather than errors)."""
    return sorted(f"{mod.__name__}.{name}" for mod in modules
                  for name, obj in vars(mod).items()
                  if inspect.isclass(obj) and issubclass(obj, Exception)
                  and obj.__module__ == mod.__name__ and not issubclass(obj, root))


def package_modules(pkg) -> list:
    return [importlib.import_module(f"{pkg.__name__}.{info.name}")
            for info in pkgutil.iter_modules(pkg.__path__)]


@pytest.mark.parametrize("pkg, root", ROOTS, ids=lambda x: getattr(x, "__name__", ""))
def test_every_error_has_its_package_root(pkg, root):
    assert not strays(package_modules(pkg), root)


def test_a_stray_error_is_found():
    planted = types.ModuleType("planted")
    planted.Stray = type("Stray", (Exception,), {"__module__": "planted"})
    planted.Fine = type("Fine", (KeyError,), {"__module__": "planted"})
    assert strays([planted], LookupError) == ["planted.Stray"]
