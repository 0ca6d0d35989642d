import unittest


class TestSubTests(unittest.TestCase):
    def test_each_item(self):
        for i in range(3):
            with self.subTest(i=i):
                self.assertNotEqual(i, 1)
