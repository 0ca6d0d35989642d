def test_sum(benchmark):
    assert benchmark.pedantic(sum, args=(range(100),), rounds=3, iterations=2) == 4950


def test_sorted(benchmark):
    benchmark.extra_info["items"] = 3
    assert benchmark.pedantic(sorted, args=([3, 1, 2],), rounds=4) == [1, 2, 3]
