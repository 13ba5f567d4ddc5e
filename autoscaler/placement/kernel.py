"""The default profiles' filters and scorers in one compiled pass over the devices.

`SliceCluster.place` on 1,000 devices spent most of its time in about thirty numpy
steps of one to two microseconds each (every filter and scorer is a whole-array
operation, and numpy's per-call cost dominates arrays this small). `best_device`
does the same arithmetic in one loop compiled by numba: per device, the filters
(kind, compute, memory, anti-affinity, and a caller's mask), then the weighted
scores, then the key `choose()` ranks by, keeping the first device with the
largest key, as `argmax` does. It is the plugins' arithmetic, not an approximation
of it: integer floor divisions in the same order, and a property test
(tests/unit/test_placement.py) holds it to `plugins.choose` decision by decision.

Only profiles made of the plugins it knows run here (`weights_of` says which);
any other profile, and every "cannot place" (which needs the plugins' per-filter
statuses for its reasons), goes through the plugins in numpy.

Pure: numpy and numba only; no clock. numba writes the compiled code to its cache
(`cache=True`, next to this file or in numba's cache directory), so a process loads
it (numba and the kernel, under a second) instead of compiling it (about two); where
no cache directory is writable, each process compiles it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from autoscaler.placement import plugins, types

# A device's compute units (types.UNITS), written here: numba's cache is keyed by this file
# alone and freezes the globals it reads, so a change of UNITS must change this file too
UNITS = 720720
if UNITS != types.UNITS:
    raise ImportError(f"placement.kernel has UNITS {UNITS}, placement.types {types.UNITS}: make them agree")

# the plugins compiled here, in the order of the weights array
SCORERS = (plugins.binpack, plugins.spread, plugins.least_fragmentation, plugins.least_busy, plugins.warm_cache)
FILTERS = frozenset((plugins.fits_kind, plugins.fits_compute, plugins.fits_memory, plugins.fits_anti_affinity))
NONE_I32 = np.zeros(0, np.int32)  # "not given" for an optional per-device array
NONE_I64 = np.zeros(0, np.int64)
NONE_BOOL = np.zeros(0, np.bool_)


def weights_of(profile: plugins.Profile) -> np.ndarray | None:
    """The profile's weight of each of SCORERS, or None when it has a filter or a scorer
    not compiled here (it then runs through the plugins). E.g. BINPACK: [3, 0, 1, 1, 1]."""
    if set(profile.filters) != FILTERS or any(p not in SCORERS for p, _ in profile.scores):
        return None
    return np.array([profile.weight(p) for p in SCORERS], np.int64)


# Arguments: per-device int32 state (free compute units and MiB, MiB capacity); the request
# (units, MiB, or MiB per device when `mib_each` is given); per-device int64 kind preference
# (0: not allowed) and tie-break (plugins.tie_break); the optional per-device arrays (empty:
# not given): duty in percent, warm node, this function's replicas, allowed; the weights
# (weights_of) and the profile's numbers.
SIGNATURE = ("int64(int32[::1], int32[::1], int32[::1], int64, int64, int32[::1], int64[::1], int64[::1], "
             "int64[::1], bool[::1], int64[::1], int64, bool[::1], int64[::1], int64, int64)")


def _best_device(free_units, free_mib, capacity_mib, units, mib, mib_each, preference, tie_break,
                 busy_pct, warm, same_function, max_per_device, allowed, weights, smallest_units,
                 smallest_mib):  # pragma: no cover - runs compiled (best_device)
    """The index of the device plugins.choose() picks, or -1 when none passes every filter."""
    n = free_units.shape[0]
    w_binpack, w_spread, w_fragmentation, w_busy, w_warm = weights[0], weights[1], weights[2], weights[3], weights[4]
    best, best_key = -1, 0
    for i in range(n):
        # filters: fits_kind, fits_compute, fits_memory, fits_anti_affinity, then the caller's mask
        if preference[i] == 0:
            continue
        left_units = np.int64(free_units[i]) - units
        if left_units < 0:
            continue
        left_mib = np.int64(free_mib[i]) - (np.int64(mib_each[i]) if mib_each.shape[0] else mib)
        if left_mib < 0:
            continue
        if same_function.shape[0] and same_function[i] >= max_per_device:
            continue
        if allowed.shape[0] and not allowed[i]:
            continue
        # scores (plugins.free_pct, spread, binpack, stranded_pct, idle_score, warm_score)
        units_pct = left_units * 100 // UNITS
        mib_pct = left_mib * 100 // capacity_mib[i]
        spread = (units_pct + mib_pct) // 2
        total = w_binpack * (100 - spread) + w_spread * spread
        if w_fragmentation:
            tiny = left_units < smallest_units
            stranded = ((units_pct if tiny or left_mib < smallest_mib else 0) + (mib_pct if tiny else 0)) // 2
            total += w_fragmentation * (100 - stranded)
        if w_busy and busy_pct.shape[0]:
            total += w_busy * (100 - busy_pct[i])
        if w_warm and warm.shape[0] and warm[i]:
            total += w_warm * 100
        # plugins.choose: (total x devices + tie-break); a device that passed has a key > 0
        key = total * n + tie_break[i]
        if key > best_key:
            best, best_key = i, key
    return best


# error_model="numpy": a division by zero (a device of 0 MiB) gives 0 as in the plugins, not an exception
try:
    best_device = njit(SIGNATURE, cache=True, nogil=True, error_model="numpy")(_best_device)
except RuntimeError:  # numba found no writable cache directory: compile in this process instead
    best_device = njit(SIGNATURE, nogil=True, error_model="numpy")(_best_device)
