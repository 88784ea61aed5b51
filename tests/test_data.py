"""sigprop/data.py: every way a --data file can be wrong is one line naming --data (exit 2), found
before anything is drawn; --samples takes the first N of the data and the record says how many
were measured (issue 27, item 1)."""

import json

import numpy as np
import pytest
import torch

from sigprop import data
from sigprop.cli import main
from sigprop.errors import SigpropError

SHAPE = (6,)


def _write(tmp_path, name, writer):
    path = tmp_path / name
    writer(path)
    return path


def _np(**arrays):
    return lambda p: np.savez(p, **arrays)


def _pt(obj):
    return lambda p: torch.save(obj, p)


def _good_x(n=20):
    return np.random.default_rng(0).standard_normal((n, 6))


def _labels(n=20, hi=10):
    return np.random.default_rng(1).integers(0, hi, n)


def _nan_x():
    x = _good_x()
    x[3, 2] = np.nan
    x[7, 0] = np.inf
    return x


BAD = {
    "corrupt.pt": (lambda p: p.write_bytes(b"not torch"), "is not a readable torch.save file"),
    "table.csv": (lambda p: p.write_text("x,y\n1,2\n"), "unknown file type '.csv'"),
    "script.py": (lambda p: p.write_text("print(1)\n"), "unknown file type '.py'"),
    "bare.pt": (
        _pt(torch.zeros(4, 6)),
        "expected a dict with keys x and y saved by torch.save (.pt), or an .npz with arrays x "
        "and y; got a Tensor",
    ),
    "keys.pt": (_pt({"inputs": torch.zeros(4, 6)}), "holds a dict with keys inputs"),
    "strings.pt": (_pt({"x": ["a", "b"], "y": torch.zeros(2)}), "x must be an array"),
    "corrupt.npz": (lambda p: p.write_bytes(b"PK\x03\x04garbage"), "is not a readable .npz archive"),
    "text.npz": (lambda p: p.write_text("hello"), "is not a readable .npz archive"),
    "object.npz": (_np(x=np.array([{"a": 1}], dtype=object), y=np.zeros(1)), "object (pickled) arrays"),
    "keys.npz": (_np(a=np.zeros(3)), "holds arrays a"),
    "nan.npz": (_np(x=_nan_x(), y=_labels()), "x holds NaN or inf in 2 of its 20 samples"),
    "labels.npz": (_np(x=_good_x(), y=_labels(hi=12)), "labels in [0, 10)"),
    "negative.npz": (_np(x=_good_x(), y=-np.ones(20, dtype=int)), "got labels from -1 to -1"),
    "float-labels.npz": (_np(x=_good_x(), y=np.zeros(20)), "got dtype float64"),
    "lengths.npz": (_np(x=_good_x(), y=_labels(19)), "y must be [N] with N = 20"),
    "shape.npz": (_np(x=np.zeros((20, 5)), y=_labels()), "x must be [N, 6]"),
    "empty.npz": (_np(x=np.zeros((0, 6)), y=np.zeros(0, dtype=int)), "x holds no samples"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_file_is_one_error_naming_data(tmp_path, name):
    writer, words = BAD[name]
    path = _write(tmp_path, name, writer)
    with pytest.raises(SigpropError) as err:
        data.load(path, SHAPE, 10)
    assert err.value.field == "data" and words in err.value.message


@pytest.mark.parametrize(
    "name", ["corrupt.pt", "table.csv", "bare.pt", "nan.npz", "corrupt.npz", "object.npz"]
)
def test_the_cli_says_it_in_one_line_with_exit_2(tmp_path, name, capsys):
    writer, words = BAD[name]
    path = _write(tmp_path, name, writer)
    rc = main(
        [
            "hessian",
            "mlp",
            "--depth",
            "2",
            "--width",
            "4",
            "--input-dim",
            "6",
            "--seeds",
            "1",
            "--device",
            "cpu",
            "--data",
            str(path),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("sigprop: error: --data: ") and words in err[0]


def test_good_files_of_both_kinds_read_the_same(tmp_path):
    x, y = _good_x(), _labels()
    a = data.load(_write(tmp_path, "d.npz", _np(x=x, y=y)), SHAPE, 10)
    b = data.load(
        _write(tmp_path, "d.pt", _pt({"x": torch.as_tensor(x), "y": torch.as_tensor(y)})), SHAPE, 10
    )
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.y, b.y)
    assert a.count == 20


def test_samples_takes_the_first_n_and_refuses_more(tmp_path):
    d = data.load(_write(tmp_path, "d.npz", _np(x=_good_x(), y=_labels())), SHAPE, 10)
    assert data.take(d, None) is d and data.take(d, 5).count == 5
    np.testing.assert_array_equal(data.take(d, 5).x, d.x[:5])
    with pytest.raises(SigpropError) as err:
        data.take(d, 21)
    assert err.value.field == "samples" and "holds 20 samples" in err.value.message


@pytest.mark.parametrize("samples, measured", [(None, 20), (7, 7)])
def test_the_record_says_how_many_samples_were_measured(tmp_path, samples, measured, capsys):
    path = _write(tmp_path, "d.npz", _np(x=_good_x(), y=_labels()))
    args = [
        "hessian",
        "mlp",
        "--depth",
        "2",
        "--width",
        "4",
        "--input-dim",
        "6",
        "--seeds",
        "1",
        "--iters",
        "3",
        "--device",
        "cpu",
        "--data",
        str(path),
        "--format",
        "json",
    ] + ([] if samples is None else ["--samples", str(samples)])
    assert main(args) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert doc["config"]["samples"] == measured and doc["environment"]["samples"] == measured
    assert f", {measured} samples x 1 draw(s)" in out.err
