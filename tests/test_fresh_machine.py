"""README's test command must work on a fresh machine, not only after `.ci/run`.

A newcomer runs the README, not `.ci/run`: whatever `.ci/run` installs that the test session
would not install by itself is a bug (the container tests once failed on a fresh machine with
"busybox not found" because only `.ci/run` installed busybox-static).
"""
import importlib.util
import pathlib
import re
import shlex

REPO = pathlib.Path(__file__).resolve().parent.parent


def _debian():
    spec = importlib.util.spec_from_file_location("trtllm_tests_debian",
                                                  REPO / "tests" / "cluster" / "debian.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _readme_test_command() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("Run the whole test suite", 1)[1]
    return next(line.strip() for line in section.splitlines()
                if line.startswith("    ") and "pytest" in line)


def _ci_commands() -> list[list[str]]:
    """Every command line of .ci/run (continuations joined), as argv."""
    text = (REPO / ".ci" / "run").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            out.append(shlex.split(line, comments=True))
    return out


def test_ci_installs_no_debian_package_the_suite_would_not_install_itself():
    debian = _debian()
    suite = set(debian.all_packages())
    ci_only = []
    for argv in _ci_commands():
        if "apt-get" in argv and "install" in argv:
            pkgs = [a for a in argv[argv.index("install") + 1:]
                    if not a.startswith("-") and not a.startswith(">")]
            ci_only += [p for p in pkgs if p not in suite]
    assert ci_only == [], (
        f".ci/run installs {ci_only}, which the test session never installs itself; "
        "add them to a group in tests/cluster/debian.py and ensure() that group where used")


def test_ci_runs_exactly_the_readme_command_and_installs_no_pip_package_of_its_own():
    readme = _readme_test_command()
    ci_text = (REPO / ".ci" / "run").read_text()
    assert readme in ci_text, f".ci/run does not run README's test command {readme!r}"
    pip_lines = [line for line in ci_text.splitlines()
                 if re.search(r"\bpip\b.*\binstall\b", line) and not line.lstrip().startswith("#")]
    assert all(readme in line for line in pip_lines), (
        f".ci/run installs Python packages outside README's command: {pip_lines}")


def test_every_group_the_suite_uses_is_installed_here():
    """On this machine the session has run ensure() (or .ci/run pre-installed): every file
    the groups promise exists, so nothing a test needs is left to a manual step."""
    debian = _debian()
    debian.ensure(*debian.GROUPS)
    missing = {g: debian.missing_files(g) for g in debian.GROUPS if debian.missing_files(g)}
    assert missing == {}


def test_fixtures_install_their_group_before_use():
    """Each helper that needs a group asks for it (not a hint to install it by hand)."""
    users = {
        "containers": REPO / "tests" / "containers_fixture.py",
        "spank": REPO / "tests" / "cluster" / "spank" / "build.py",
        "cluster": REPO / "tests" / "cluster" / "up",
    }
    for group, path in users.items():
        text = path.read_text()
        assert re.search(rf"ensure\(\s*\"{group}\"", text), f"{path} never ensures {group!r}"
        assert "apt-get install -y busybox-static" not in text
