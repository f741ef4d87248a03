"""Matrix scenarios, one module each. ``SCENARIOS`` maps id -> scenario instance, in run order."""

from __future__ import annotations

from . import (alloc, compute, copy_memset, device_info, disconnect, handshake, load,
               model_load, roundtrip, two_clients, weights_cache, weights_only)

SCENARIOS = {s.id: s for s in (
    handshake.Handshake(), device_info.DeviceInfo(), alloc.Alloc(), roundtrip.Roundtrip(),
    weights_cache.WeightsCache(), weights_only.WeightsOnly(), compute.Compute(),
    copy_memset.CopyMemset(), disconnect.Disconnect(), two_clients.TwoClients(),
    model_load.ModelLoad(), load.Load(),
)}
