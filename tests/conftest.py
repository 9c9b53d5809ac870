import os

# Inductor probes the CPU's vector instruction sets by compiling a test program for each, once per empty cache
# (about 9 s, again in every process that compiles into a cache of its own); the tests take the CPU's flags as they
# are, so the probe (the compiler's business, not ours) is skipped. Set before torch reads its configuration.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

# One thread: tiny tensors gain nothing from two, and on a loaded machine two spin against each other.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
