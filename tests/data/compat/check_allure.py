import allure
import pytest


@pytest.fixture
def resource():
    yield "r"


@allure.title("A titled test")
@allure.feature("compat")
def test_steps_and_attachment(resource):
    with allure.step("step one"):
        allure.attach("body", name="an attachment", attachment_type=allure.attachment_type.TEXT)


def test_fails_in_a_step():
    with allure.step("a failing step"):
        assert 0, "the step failed"
