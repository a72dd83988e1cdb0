"""The object array of an ``.npy`` file, read from its pickle without running the pickle's code.

``np.save`` pickles an object array as ``numpy._core.multiarray._reconstruct`` (an empty array)
plus its state (shape, dtype, fortran order, the elements), each element array the same way,
dtypes as ``numpy.dtype`` plus their state and NumPy integers as ``multiarray.scalar``. The
unpickler here answers exactly those names, with stand-ins that check each state before building
anything: a pickle naming any other global is refused before it is looked up, and a state NumPy's
own ``__setstate__`` would trust (an object array whose shape is larger than its element list
reads past the list and crashes the process) is refused with what is wrong. Nothing is allocated
before the file's bytes have shown it holds that much.
"""

from __future__ import annotations

import math
import pickle
import re
from typing import IO, Any, Literal

import numpy as np

__all__ = ["Refused", "load_object_array"]

_DTYPES = re.compile(r"^(O[48]|[iu][1248]|b1|f[248])$")  # what documents (or refusable look-alikes) use
_MAX_DIMS = 32  # NumPy's own limit


class Refused(pickle.UnpicklingError):
    """The pickle names, or builds, something an array of documents does not need."""


class _NotCallable:
    """What ``numpy.ndarray`` unpickles as: ``_reconstruct`` takes it, a pickle cannot call it
    (``ndarray(shape)`` would allocate whatever shape the file asks for)."""

    __slots__ = ()

    def __call__(self, *args: object, **kwargs: object) -> None:
        raise Refused("it calls numpy.ndarray itself")


_NDARRAY = _NotCallable()


class _Dtype:
    """A ``numpy.dtype`` being unpickled: a simple type name, then its byte order from the state."""

    __slots__ = ("spec", "dtype")

    def __init__(self, spec: object, align: object = False, copy: object = False) -> None:
        if not isinstance(spec, str) or not _DTYPES.match(spec):
            raise Refused(f"it builds dtype {spec!r}; documents are integer arrays")
        self.spec: str = spec
        self.dtype: np.dtype | None = None

    def __setstate__(self, state: object) -> None:
        # (version, byte order, subarray, names, fields, item size, alignment, flags[, metadata])
        if not isinstance(state, tuple) or len(state) not in (8, 9) or state[1] not in ("<", ">", "|", "="):
            raise Refused(f"it gives dtype {self.spec} the state {state!r}")
        if any(part is not None for part in state[2:5]):
            raise Refused(f"it gives dtype {self.spec} fields or a subarray; documents are plain integer arrays")
        dtype = np.dtype(self.spec)
        self.dtype = dtype.newbyteorder(state[1]) if state[1] in "<>" else dtype


def _real_dtype(value: object) -> np.dtype:
    if not isinstance(value, _Dtype) or value.dtype is None:
        raise Refused(f"it uses {value!r} as a dtype")
    return value.dtype


class _Array:
    """An array being unpickled: empty until its state arrives (``BUILD``)."""

    __slots__ = ("array",)

    def __init__(self) -> None:
        self.array: np.ndarray | None = None

    def __setstate__(self, state: object) -> None:
        if not isinstance(state, tuple) or len(state) != 5:
            raise Refused(f"it gives an array the state {_what(state)}, not (version, shape, dtype, order, data)")
        _version, shape, dtype, fortran, data = state
        if not isinstance(shape, tuple) or len(shape) > _MAX_DIMS:
            raise Refused(f"it gives an array the shape {shape!r}")
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
            raise Refused(f"it gives an array the shape {shape!r}")
        real, count = _real_dtype(dtype), math.prod(shape)
        order: Literal["C", "F"] = "F" if fortran else "C"
        if real.hasobject:
            if not isinstance(data, list) or len(data) != count:
                raise Refused(
                    f"the state of an object array of shape {shape} holds {_what(data)}, not {count} elements"
                )
            flat = np.empty(count, dtype=object)
            for i, item in enumerate(data):
                flat[i] = resolve(item)
            self.array = flat.reshape(shape, order=order)
            return
        if not isinstance(data, bytes) or len(data) != count * real.itemsize:
            need = count * real.itemsize
            raise Refused(f"the state of a {real} array of shape {shape} holds {_what(data)}, not {need} bytes")
        self.array = np.frombuffer(data, dtype=real).reshape(shape, order=order)


def _what(data: object) -> str:
    if isinstance(data, list):
        return f"a list of {len(data)}"
    return f"{len(data)} bytes" if isinstance(data, bytes) else f"a {type(data).__name__}"


def _reconstruct(subtype: object, shape: object, dtype: object) -> _Array:
    """``np.save`` always pickles an empty array plus its state; the shape given here is ignored."""
    if subtype is not _NDARRAY:
        raise Refused(f"it rebuilds an array of type {subtype!r}, not numpy.ndarray")
    return _Array()


def _scalar(dtype: object, data: object) -> Any:
    real = _real_dtype(dtype)
    if real.hasobject or not isinstance(data, bytes) or len(data) != real.itemsize:
        raise Refused(f"it builds a NumPy {real} scalar from {data!r}")
    return np.frombuffer(data, dtype=real)[0]


def resolve(value: object) -> object:
    """``value`` with every array stand-in replaced by its array (lists and tuples looked into)."""
    if isinstance(value, _Array):
        if value.array is None:
            raise Refused("it names an array but never gives its state")
        return value.array
    if isinstance(value, _Dtype):
        return _real_dtype(value)
    if isinstance(value, list):
        return [resolve(v) for v in value]
    if isinstance(value, tuple):
        return tuple(resolve(v) for v in value)
    return value


_MULTIARRAY = ("numpy.core.multiarray", "numpy._core.multiarray")  # NumPy 1 and NumPy 2 files
_ALLOWED: dict[tuple[str, str], object] = {
    ("numpy", "ndarray"): _NDARRAY,
    ("numpy", "dtype"): _Dtype,
    **{(m, "_reconstruct"): _reconstruct for m in _MULTIARRAY},
    **{(m, "scalar"): _scalar for m in _MULTIARRAY},
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = _ALLOWED.get((module, name))
        if found is None:
            raise Refused(
                f"its pickle names {module}.{name}; an object .npy may hold only NumPy arrays, lists and numbers"
            )
        return found


def load_object_array(f: IO[bytes]) -> object:
    """The object the pickle at ``f``'s position builds (for a ``.npy`` written by ``np.save``, an
    object ``np.ndarray``). Raises :class:`Refused` for a pickle outside that, or the
    ``pickle``/Python error a truncated or corrupt one gives."""
    return resolve(_Unpickler(f).load())
