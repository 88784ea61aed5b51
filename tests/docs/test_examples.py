"""Every example output quoted in README.md and docs/*.md is what the tool prints now (issue 27, item 9:
bands and counts in the docs had drifted two releases behind the tool).  The rules of the
comparison and the way to regenerate the docs: tests/docs/examples.py."""

import importlib.util
import re

import pytest

import examples as ex  # tests/docs/examples.py (pytest puts this folder on sys.path)

EXAMPLES = ex.examples()


def test_there_are_examples_in_the_readme_and_the_docs():
    names = {e.path.name for e in EXAMPLES}
    assert "README.md" in names and len(names) >= 3


@pytest.mark.parametrize("example", EXAMPLES, ids=[f"{e.path.name}: {e.command}" for e in EXAMPLES])
def test_the_quoted_lines_are_the_tools_output(example, tmp_path):
    for package, path in re.findall(r"\bmodule\s+([A-Za-z_]\w*)([\w.]*):", example.command):
        # a model zoo's example (the [models] extra), not a file of the docs
        if not path.endswith(".py") and importlib.util.find_spec(package) is None:
            pytest.skip(f"needs {package} (pip install '.[models]'; CI installs it)")
    (tmp_path / "docs").symlink_to(ex.ROOT / "docs")
    (tmp_path / "examples").symlink_to(ex.ROOT / "examples")  # the docs' own example models
    problems, _ = ex.compare(example, ex.run(example, tmp_path))
    assert not problems, "\n".join(problems) + "\n(python tests/docs/examples.py --update regenerates them)"


@pytest.mark.parametrize(
    "quoted, line, same",
    [
        ("  1  0.997±0.075  =", "  1  0.998±0.074  =", True),  # one unit in the last printed digit
        ("  1  0.997±0.075  =", "  1  0.999±0.075  =", False),  # two
        ("  1  0.997", " 21  0.997", False),  # integers are whole and equal
        ("4.58e3±766", "4.59e3±767", True),
        ("4.58e3±766", "4.60e3±766", False),
        ("3 passed, 0 failed in 8.5 s", "3 passed, 0 failed in 41.2 s", True),  # durations are not compared
        (
            "typical ... ratio 0.812 in [0.384, 2.1]",
            "typical forward ratio 0.812 in [0.384, 2.1]; more",
            True,
        ),
    ],
)
def test_numbers_are_compared_to_their_printed_precision(quoted, line, same):
    assert (ex.match_line(quoted, line) is not None) is same


def test_quoted_config_files_are_the_files_the_examples_run():
    """A ```toml block whose first line names a file under docs/examples is that file, byte for byte:
    the config a reader copies is the config the example ran."""
    import re

    found = 0
    for path in ex.DOCS:
        for m in re.finditer(
            r"^```toml\n(# (docs/examples/[\w.-]+).*?)^```", path.read_text(encoding="utf-8"), re.S | re.M
        ):
            found += 1
            assert (ex.ROOT / m.group(2)).read_text(encoding="utf-8") == m.group(1), (path.name, m.group(2))
    assert found >= 1
