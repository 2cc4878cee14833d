"""The alerting tests run the real tools: promtool (root conftest), amtool and Alertmanager."""

from __future__ import annotations

import pytest

from tests.conftest import find_binary


@pytest.fixture(scope="session")
def amtool() -> str:
    return find_binary("amtool")
