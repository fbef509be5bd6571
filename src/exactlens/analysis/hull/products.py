"""The matrix products of the unselectable-keys check (``hull``), run by torch on a set number of threads.

The lowest layer of the hull modules: plain arrays in, plain arrays out, no solver state.
"""

from __future__ import annotations

import numpy as np
import torch

from exactlens.resources import torch_threads

THREADS = 1  # CPU threads of the large matrix products (see threads_for_products)


def threads_for_products():
    """Run the large matrix products (``product_t``) on THREADS threads, restoring torch's count after.

    Measured on a shared 2-core machine under load: a multi-threaded BLAS (numpy's OpenBLAS or
    torch's) spins on cores other processes hold and runs these products 10-35x slower than one
    thread does; numpy's BLAS threads cannot be set at run time, torch's can.
    """
    return torch_threads(THREADS)


def product_t(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b.T for 2-D float arrays of one dtype, as a numpy array (computed by torch, see above)."""
    return (torch.from_numpy(a) @ torch.from_numpy(b).T).numpy()


def scores_along(Y: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Y @ q for one direction q (a fresh array)."""
    return product_t(Y, q[None, :])[:, 0].copy()
