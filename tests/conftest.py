"""Test-suite-wide hooks.

pytest-trio runs in ``trio_mode`` (pyproject.toml): it marks every async
test function as a Trio test. Tests marked ``@pytest.mark.anyio`` are
AnyIO's instead, run once per backend (asyncio and Trio) by AnyIO's pytest
plugin; pytest-trio's mark is taken off them here, after it was added.
They must not use async fixtures (pytest-trio would claim those).
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("anyio") is not None:
            item.own_markers[:] = [m for m in item.own_markers if m.name != "trio"]


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Every AnyIO test runs on both backends."""
    return str(request.param)
