"""Scalar arguments checked before they reach ctypes, which would otherwise turn a float into an
int by truncation (int(2.7) == 2), None or a string into an obscure error, and an int outside the
C type's range into another int silently (ctypes keeps the low bits: 2**64 + 3 becomes 3)."""

import operator

import numpy as np

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def to_int(value, name, low=INT64_MIN, high=INT64_MAX):
    """An integer argument: a Python or NumPy integer, or anything else with __index__ (a 0-d
    integer array, a one-element integer tensor); not a bool, a float, a string or None. It must
    lie in [low, high] (by default int64, the C ABI's int64_t)."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"mlakit: {name} must be an integer, got a bool ({value!r})")
    try:
        result = operator.index(value)
    except TypeError:
        raise TypeError(
            f"mlakit: {name} must be an integer, got {type(value).__name__} ({value!r})"
        ) from None
    if not low <= result <= high:
        raise ValueError(f"mlakit: {name} must be in [{low}, {high}], got {result}")
    return result


def to_int32(value, name):
    """to_int for a C int32_t argument (enum codes)."""
    return to_int(value, name, INT32_MIN, INT32_MAX)


def to_bool(value, name):
    """A flag: a Python or NumPy bool, or the integers 0 and 1; not None, a string or a float
    (so that causal=None or causal="no" is not read as a truth value)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    raise TypeError(f"mlakit: {name} must be a bool, got {type(value).__name__} ({value!r})")
