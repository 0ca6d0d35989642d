def test_each_item(subtests):
    for i in range(3):
        with subtests.test(msg="item", i=i):
            assert i != 1
