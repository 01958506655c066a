"""Test setup: Triton runs interpreted on machines without CUDA (set before triton loads);
the planner's compiled packer is built into a cache of the session's own, not the user's."""

import os
import shutil
import tempfile

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# A test run leaves nothing in ~/.cache; a cache the caller names is kept.
_OWN_CACHE = None
if not os.environ.get("STEPPLAN_CACHE_DIR"):
    _OWN_CACHE = os.environ["STEPPLAN_CACHE_DIR"] = tempfile.mkdtemp(prefix="stepplan-tests-")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _OWN_CACHE:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
