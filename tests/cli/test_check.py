"""``sigprop check``: exit codes 0/1/2, one line per check, JSON and JUnit XML, config errors
naming the file and line."""

import json
import xml.etree.ElementTree as ET

import pytest

from sigprop.cli import main

SMALL = 'samples = 64\nwidth = 48\ndevice = "cpu"\n'

GOOD = f"""
[checks.mlp-proposed]
command = "mlp"
depth = 6
init = ["proposed", "proposed-gaussian"]
{SMALL}
[checks.mlp-he-breaks]
command = "mlp"
depth = 20
init = "he"
expect = "fail"
{SMALL}
[checks.resnet-proposed]
command = "resnet"
blocks = 8
dim = 64
{SMALL}"""


def run(capsys, monkeypatch, tmp_path, text, *args, name="sigprop.toml"):
    (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    code = main(["check", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_passing_config_exits_0_with_one_line_per_check_and_junit(capsys, monkeypatch, tmp_path):
    code, out, err = run(capsys, monkeypatch, tmp_path, GOOD, "--junit", "report.xml")
    assert code == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 5  # 2 + 1 + 1 (check, init) lines and the summary
    assert lines[0].startswith(
        "PASS  mlp-proposed [proposed] (expected to hold: signal preserved): typical forward ratio at layer 6"
    )
    assert (
        "(expected to fail: signal preserved; failed: signal preserved)" in lines[2] and "outside" in lines[2]
    )
    assert lines[-1].startswith("4 passed, 0 failed")
    suite = ET.parse(tmp_path / "report.xml").getroot()
    assert suite.tag == "testsuite" and suite.get("tests") == "4" and suite.get("failures") == "0"
    cases = suite.findall("testcase")
    assert [(c.get("classname"), c.get("name")) for c in cases][:2] == [
        ("sigprop.mlp-proposed", "proposed"),
        ("sigprop.mlp-proposed", "proposed-gaussian"),
    ]
    assert all(c.find("failure") is None for c in cases)


def test_a_broken_expectation_exits_1_and_junit_shows_the_failure(capsys, monkeypatch, tmp_path):
    text = GOOD.replace('init = "he"\nexpect = "fail"', 'init = "he"')  # he now expected to pass
    code, out, err = run(capsys, monkeypatch, tmp_path, text, "--junit", "report.xml")
    assert code == 1
    fail = [l for l in out.splitlines() if l.startswith("FAIL")]
    assert len(fail) == 1 and "mlp-he-breaks [he]" in fail[0]
    assert "3 passed, 1 failed" in out
    suite = ET.parse(tmp_path / "report.xml").getroot()
    assert suite.get("failures") == "1"
    failure = [c for c in suite.findall("testcase") if c.find("failure") is not None]
    assert [c.get("classname") for c in failure] == ["sigprop.mlp-he-breaks"]
    assert "(expected to hold: signal preserved; failed: signal preserved)" in failure[0].find("failure").get(
        "message"
    )


def test_a_good_init_expected_to_fail_is_a_failure(capsys, monkeypatch, tmp_path):
    text = GOOD.replace(
        'depth = 6\ninit = ["proposed", "proposed-gaussian"]', 'depth = 6\ninit = "proposed"\nexpect = "fail"'
    )
    code, out, _ = run(capsys, monkeypatch, tmp_path, text)
    assert (
        code == 1 and "FAIL  mlp-proposed [proposed] (expected to fail: signal preserved; none failed)" in out
    )


def test_a_check_expected_to_fail_says_which_gate_failed(capsys, monkeypatch, tmp_path):
    """Issue 27, item 6: 0.7.0 printed "(expected: not signal preserved and inputs kept apart)" for a
    run whose signal was preserved and whose correlation gate failed -- it read as the opposite of
    what happened.  Now the line names the gates that could fail and the one that did."""
    text = (
        '[checks.collapse]\ncommand = "mlp"\ndepth = 30\nwidth = "64"\ninput-dim = 64\ninit = '
        '"proposed"\nsamples = 50\n'
        'max_correlation = 0.9\nexpect = "fail"\ndevice = "cpu"\n'
    )
    code, out, err = run(capsys, monkeypatch, tmp_path, text)
    assert code == 0, err
    line = out.splitlines()[0]
    assert line.startswith(
        "PASS  collapse [proposed] (expected to fail: one of signal preserved, inputs kept apart "
        "(--max-correlation); failed: inputs kept apart (--max-correlation)): "
    )
    assert " in [" in line and "> 0.9" in line


def test_json_format(capsys, monkeypatch, tmp_path):
    code, out, err = run(capsys, monkeypatch, tmp_path, GOOD, "--format", "json")
    assert code == 0
    doc = json.loads(out)
    assert doc["schema"] == "sigprop.check.v1" and doc["passed"] is True
    assert doc["summary"]["passed"] == 4 and doc["summary"]["failed"] == 0
    he = [c for c in doc["checks"] if c["init"] == "he"][0]
    assert he["expect"] == "fail" and he["signal_passed"] is False and he["ok"] is True
    assert he["gates"][0]["measured"] < he["gates"][0]["low"]
    assert doc["results"]["resnet-proposed"]["command"] == "resnet"
    assert "4 passed" in err


def test_pyproject_table_is_the_default(capsys, monkeypatch, tmp_path):
    text = '[project]\nname = "x"\n\n' + GOOD.replace("[checks.", "[tool.sigprop.checks.")
    (tmp_path / "sigprop.toml").write_text("this is not read")
    code, out, err = run(capsys, monkeypatch, tmp_path, text, name="pyproject.toml")
    assert code == 0, err
    assert "pyproject.toml" in err


@pytest.mark.parametrize(
    "text, line, words",
    [
        ('[checks.a]\ncommand = "mlp"\ndepth = = 3\n', 3, "TOML syntax"),
        ('[checks.a]\ncommand = "mlp"\n\ndept = 3\n', 4, "did you mean 'depth'"),
        ('[checks.a]\ncommand = "mlp"\ndepth = "ten"\n', 3, "depth must be an integer"),
        ('[checks.a]\ncommand = "mlp"\ndepth = true\n', 3, "depth must be an integer"),
        ('[checks.a]\ncommand = "rnn"\n', 2, "command must be"),
        ("[checks.a]\ndepth = 3\n", 1, "command must be"),
        ('[checks.a]\ncommand = "mlp"\ninit = "nope"\n', 3, "unknown init 'nope'"),
        ('[checks.a]\ncommand = "mlp"\ndepth = 0\n', 3, "depth"),
        ('[checks.a]\ncommand = "mlp"\nwidth = "9:1"\n', 3, "reversed"),
        ('[checks.a]\ncommand = "mlp"\nexpect = "maybe"\n', 3, "expect must be"),
        ('[checks.a]\ncommand = "resnet"\nnorm = "bn"\ninit = "proposed"\n', 4, "He init"),
        ('[checks.a]\ncommand = "resnet"\ndepth = 3\n', 3, "unknown key 'depth' for resnet"),
        ('[checks.ok]\ncommand = "mlp"\n\n[checks.b]\ncommand = "mlp"\nsamples = -1\n', 6, "samples"),
        ("[other]\nx = 1\n", 1, "no [checks.NAME] tables"),
    ],
)
def test_bad_config_exits_2_naming_file_and_line(capsys, monkeypatch, tmp_path, text, line, words):
    code, out, err = run(capsys, monkeypatch, tmp_path, text)
    assert code == 2
    assert out == ""  # nothing ran
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert f"sigprop.toml:{line}:" in lines[0] and words in lines[0], lines[0]


def test_no_config_anywhere_exits_2(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert main(["check"]) == 2
    assert "no checks found" in capsys.readouterr().err
    assert main(["check", "missing.toml"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_junit_target_is_validated_before_running(capsys, monkeypatch, tmp_path):
    code, out, err = run(capsys, monkeypatch, tmp_path, GOOD, "--junit", "/nonexistent-dir/r.xml")
    assert code == 2 and out == "" and "--junit" in err


CURVATURE = """
[checks.lowest]
command = "mlp"
depth = 4
width = "32"
input-dim = 32
init = ["proposed", "datadep"]
lowest_curvature = "proposed"
samples = 32
seeds = 2
device = "cpu"

[checks.datadep-is-not-lowest]
command = "mlp"
depth = 4
width = "32"
input-dim = 32
init = ["proposed", "datadep"]
lowest_curvature = "datadep"
expect = "fail"
samples = 32
seeds = 2
iters = 50
device = "cpu"
"""


def test_lowest_curvature_check(capsys, monkeypatch, tmp_path):
    """A curvature gate (issue 19): the named init's mean log10 spectral norm below the others';
    a canary that the gate can fail; JUnit and JSON carry it."""
    import json

    code, out, err = run(capsys, monkeypatch, tmp_path, CURVATURE, "--junit", "report.xml")
    assert code == 0, out + err
    lines = [ln for ln in out.splitlines() if ln.startswith(("PASS", "FAIL"))]
    assert len(lines) == 2 and all(ln.startswith("PASS") for ln in lines), out
    assert "spectral norm of the loss Hessian (below datadep)" in out
    code, out, _ = run(capsys, monkeypatch, tmp_path, CURVATURE, "--format", "json")
    doc = json.loads(out)
    gates = [g for o in doc["checks"] for g in o["gates"]]
    assert [g["verdict"] for g in gates] == ["curvature", "curvature"] and [g["passed"] for g in gates] == [
        True,
        False,
    ]
    assert (
        doc["results"]["lowest"]["schema"] == "sigprop.hessian.v1"
        and doc["results"]["lowest"]["config"]["head"] == "pytorch"
    )
    for bad, words in (
        ('lowest_curvature = "he"', "lowest_curvature must name one of"),
        ("iters = 5", "applies to a lowest_curvature check only"),
        ('head = "init"', "applies to a lowest_curvature check only"),
        ('lowest_curvature = "proposed"\nhead = "wn"', "expected one of pytorch, init"),
    ):
        text = '[checks.a]\ncommand = "mlp"\ndepth = 2\ninit = ["proposed", "datadep"]\n' + bad + "\n"
        code, out, err = run(capsys, monkeypatch, tmp_path, text)
        assert code == 2 and words in err and "sigprop.toml:" in err, err


def test_a_check_without_init_checks_proposed_or_the_nets_own_default(tmp_path):
    """docs/cli.md: ``init`` defaults to proposed; a net that cannot take it (--norm bn: He
    weights and batch norm) runs the command's default."""
    from sigprop import checks

    path = tmp_path / "sigprop.toml"
    path.write_text(
        '[checks.a]\ncommand = "wrn"\n\n[checks.b]\ncommand = "resnet"\nnorm = "bn"\n\n'
        '[checks.c]\ncommand = "mlp"\ninit = ["he", "proposed"]\n'
    )
    a, b, c = checks.load(path, ("checks",))
    assert a.spec.inits == ("proposed",) and b.spec.inits == ("he",) and c.spec.inits == ("he", "proposed")
