"""The user's data (``--data FILE``): a ``.pt`` (``torch.save`` of a dict) or an ``.npz`` with an
array ``x`` [N, ...] and integer labels ``y`` [N].  Every way a file can be wrong is one
SigpropError naming ``data`` and what was expected, raised before anything is drawn: a file that
is not a readable archive of its suffix, a payload that is not a dict, missing keys, arrays of
the wrong kind or shape, non-finite inputs, labels out of range, lengths that differ.

Imports torch at call (``torch.load``); numpy only otherwise.
"""

from __future__ import annotations

import math
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from sigprop.errors import SigpropError

#: what every message ends with: the one layout sigprop reads
EXPECTED = "a dict with keys x and y saved by torch.save (.pt), or an .npz with arrays x and y"


@dataclass(frozen=True)
class Data:
    """Inputs ``x`` [N, *shape] (float64 numpy) and integer labels ``y`` [N] (int64 numpy), read
    from ``path``."""

    x: np.ndarray
    y: np.ndarray
    path: str

    @property
    def count(self) -> int:
        return int(self.x.shape[0])


def _refuse(message: str) -> SigpropError:
    return SigpropError(message, field="data")


def _read_npz(path: Path) -> tuple[object, object]:
    try:
        archive = np.load(path, allow_pickle=False)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise _refuse(
            f"{path} is not a readable .npz archive ({type(exc).__name__}); expected {EXPECTED}"
        ) from None
    if not isinstance(archive, np.lib.npyio.NpzFile):  # np.load also reads a bare .npy saved under the name
        raise _refuse(f"{path} holds one array, not an archive; expected {EXPECTED}")
    with archive:
        missing = [k for k in ("x", "y") if k not in archive.files]
        if missing:
            raise _refuse(f"{path} holds arrays {', '.join(archive.files) or '(none)'}; expected {EXPECTED}")
        try:
            return archive["x"], archive["y"]
        except ValueError:  # an object array: numpy would need to unpickle it
            raise _refuse(f"{path} holds object (pickled) arrays; save numeric arrays x and y") from None
        except (zipfile.BadZipFile, OSError, EOFError, zipfile.LargeZipFile) as exc:
            raise _refuse(
                f"{path} is not a readable .npz archive ({type(exc).__name__}); expected {EXPECTED}"
            ) from None


def _read_pt(path: Path) -> tuple[object, object]:
    try:
        with warnings.catch_warnings():  # torch's own warnings name torch's lines, not the user's file
            warnings.simplefilter("ignore")
            payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # any failure to unpickle is the file's, said in one line
        raise _refuse(
            f"{path} is not a readable torch.save file ({type(exc).__name__}); expected {EXPECTED}"
        ) from None
    if not isinstance(payload, dict):
        raise _refuse(f"expected {EXPECTED}; got a {type(payload).__name__}")
    missing = [k for k in ("x", "y") if k not in payload]
    if missing:
        keys = ", ".join(map(str, payload)) or "(none)"
        raise _refuse(f"{path} holds a dict with keys {keys}; expected {EXPECTED}")
    return payload["x"], payload["y"]


def _array(value, name: str, path: Path) -> np.ndarray:
    """A tensor or array as numpy; anything else (lists of strings, scalars) refused."""
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    if not isinstance(value, np.ndarray):
        raise _refuse(f"{path}: {name} must be an array (tensor or numpy), got a {type(value).__name__}")
    if value.dtype.kind not in "biuf":
        raise _refuse(f"{path}: {name} must hold numbers, got dtype {value.dtype}")
    return value


def load(path, shape, classes: int | None) -> Data:
    """Read and check ``path``: x must be [N, *shape] (or [N, prod(shape)]) of finite numbers, y
    [N] integer labels in [0, classes), N >= 1 (``classes`` None: labels >= 0, their bound checked
    by the caller once it knows the model's outputs, ``check_labels``)."""
    p = Path(path)
    if not p.is_file():
        raise _refuse(f"{p} is a directory, not a file" if p.is_dir() else f"no such file: {p}")
    suffix = p.suffix.lower()
    if suffix == ".npz":
        x, y = _read_npz(p)
    elif suffix in (".pt", ".pth"):
        x, y = _read_pt(p)
    else:
        raise _refuse(f"{p}: unknown file type {suffix or '(no suffix)'!r}; expected {EXPECTED}")
    x, y = _array(x, "x", p), _array(y, "y", p)
    want = "x".join(map(str, shape))
    if x.ndim < 2 or math.prod(x.shape[1:]) != math.prod(shape):
        raise _refuse(f"{p}: x must be [N, {want}] (the net's input), got {list(x.shape)}")
    if y.ndim != 1 or y.shape[0] != x.shape[0]:
        raise _refuse(f"{p}: y must be [N] with N = {x.shape[0]} (x's samples), got {list(y.shape)}")
    if x.shape[0] < 1:
        raise _refuse(f"{p}: x holds no samples")
    finite = np.isfinite(x)
    if not finite.all():
        bad = int(np.count_nonzero(~finite.reshape(x.shape[0], -1).all(axis=1)))
        raise _refuse(f"{p}: x holds NaN or inf in {bad} of its {x.shape[0]} samples")
    within = "(class indices)" if classes is None else f"in [0, {classes})"
    if y.dtype.kind == "f" or y.dtype.kind == "b":
        raise _refuse(f"{p}: y must hold integer labels {within}, got dtype {y.dtype}")
    if int(y.min()) < 0 or (classes is not None and int(y.max()) >= classes):
        raise _refuse(
            f"{p}: y must hold integer labels {within}, got labels from {int(y.min())} to {int(y.max())}"
        )
    return Data(x.reshape(x.shape[0], -1).astype(np.float64), y.astype(np.int64), str(p))


def check_labels(data: Data, outputs: int) -> None:
    """Labels that name a class the model has no output for, refused (``load`` with ``classes``
    None defers this until the model's output size is known)."""
    top = int(data.y.max())
    if top >= outputs:
        raise _refuse(
            f"{data.path}: y holds label {top}, and the model has {outputs} output(s): labels must be in "
            f"[0, {outputs})"
        )


def inputs(data: Data, device, dtype) -> torch.Tensor:
    """x as the run's tensor [N, prod(shape)] in ``dtype``, checked finite after the cast: a file
    that is finite in float64 can overflow float32 (|x| > 3.4e38), and the run must not see inf."""
    x = torch.as_tensor(data.x, device=device, dtype=dtype)
    finite = torch.isfinite(x).all(dim=1)
    if not bool(finite.all()):
        bad = int((~finite).sum())
        largest = float(np.abs(data.x).max())
        raise _refuse(
            f"{data.path}: x overflows {str(dtype).replace('torch.', '')} in {bad} of its {data.count} "
            f"samples (largest |x| {largest:.3g}): rescale it, or run in float64 (--dtype float64)"
        )
    return x


def take(data: Data, samples: int | None) -> Data:
    """The first ``samples`` of the data (None: all); more than the data holds is refused."""
    if samples is None or samples == data.count:
        return data
    if samples > data.count:
        raise SigpropError(
            f"{data.path} holds {data.count} samples; --samples {samples} asks for more "
            "(leave --samples out to use them all)",
            field="samples",
        )
    return Data(data.x[:samples], data.y[:samples], data.path)
