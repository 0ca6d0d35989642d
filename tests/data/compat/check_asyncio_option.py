import asyncio


async def test_runs_in_auto_mode():
    await asyncio.sleep(0)
