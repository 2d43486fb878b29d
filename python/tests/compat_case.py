"""Pieces shared by the mlakit.compat tests (test_compat_vllm.py, test_compat_flash_mla.py): the
devices a test runs on, and the float64 value of every e4m3fn code (the references' own table, from
the OCP format definition, independent of torch's conversion)."""

import numpy as np
import pytest
import torch

import mlakit


def _devices():
    params = [pytest.param("cpu", id="cpu")]
    if torch.cuda.is_available():  # GPU machine only (minimal: the same checks on CUDA tensors)
        cuda_build = mlakit.build_info()["cuda"]
        params.append(pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(
            not cuda_build, reason="mlakit was built without CUDA")))
    return params


DEVICES = _devices()


def e4m3_table():
    """float64 value of each e4m3fn code: sign bit, 4 exponent bits (bias 7), 3 mantissa bits;
    exponent 0 is subnormal (m / 8 * 2^-6); S.1111.111 is NaN (there are no infinities)."""
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exponent = (codes >> 3) & 0xF
    mantissa = (codes & 0x7).astype(np.float64)
    magnitude = np.where(exponent == 0, mantissa / 8 * 2.0**-6,
                         (1 + mantissa / 8) * 2.0 ** (exponent - 7.0))
    values = sign * magnitude
    values[(exponent == 0xF) & (mantissa == 7)] = np.nan
    return values


E4M3 = e4m3_table()
