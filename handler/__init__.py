"""warmstart's function shim: init phase, event sources, tasks and model backends.

Nothing here imports `transformers`, `sentence-transformers` or `boto3`: this package is the function's
import chain and its cold start is the product.
"""

import os as _os
import sys as _sys

# Before numpy can load (this package's __init__ runs before any of its modules): numpy's bundled OpenBLAS
# starts a worker thread per core at load that spins ~110 ms of CPU. The function path never calls BLAS, and
# under a Lambda CPU quota that spin is ~40-60 ms of init wall time (docs/coldstart.md). An explicit
# OPENBLAS_NUM_THREADS wins; WARMSTART_BLAS_THREADS=default leaves OpenBLAS alone. Not OMP_/MKL_NUM_THREADS:
# those would also cap torch's intra-op pool. What happened goes into the init report ("coldstart").
_wanted = _os.environ.get("WARMSTART_BLAS_THREADS", "1").strip() or "1"
if _wanted == "default":
    _by = "off"
elif "OPENBLAS_NUM_THREADS" in _os.environ:
    _by = "environment"
else:
    _os.environ["OPENBLAS_NUM_THREADS"] = _wanted
    _by = "warmstart"
BLAS_THREADS: dict[str, object] = {
    "OPENBLAS_NUM_THREADS": _os.environ.get("OPENBLAS_NUM_THREADS"),
    "by": _by,
    # numpy imported before this package (a host that imports numpy first): the setting came too late.
    "too_late": "numpy" in _sys.modules,
}
