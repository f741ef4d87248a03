"""Matrix scenarios, one module each.

Importing the package imports every module in it; each defines one class decorated with
``harness.scenario.scenario``, which registers it in ``harness.scenario.SCENARIOS``. Adding a
scenario is adding a module here (see docs/EXTENDING.md).
"""

from __future__ import annotations

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")
