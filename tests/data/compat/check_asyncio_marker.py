import asyncio

import pytest
import pytest_asyncio


@pytest_asyncio.fixture  # strict mode: an async fixture says whose it is
async def answer():
    await asyncio.sleep(0)
    return 42


@pytest.mark.asyncio
async def test_awaits(answer):
    await asyncio.sleep(0)
    assert answer == 42
