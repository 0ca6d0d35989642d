import asyncio

import pytest


@pytest.fixture
async def answer():
    await asyncio.sleep(0)
    return 42


@pytest.mark.asyncio
async def test_awaits(answer):
    await asyncio.sleep(0)
    assert answer == 42
