"""Where code reads a tensor's values on the host, found on any device.

On a GPU each such read is a host synchronisation: the host waits until the device has computed the value,
so it cannot queue the next kernels while the last ones run. A training step of a small model is mostly
launches (BENCHMARKS.md, "The GPU check": kernels busy 6-28 % of a step on an H200), so one wait a step
costs it a whole queue's lead. CUDA counts them itself (``torch.cuda.set_sync_debug_mode``), but only
on a GPU; :class:`HostReads` finds the same places on a CPU, from what the code asks of its tensors, so
the tests can hold every recipe's step to none::

    with HostReads() as found:
        trainer.train_step(batch)
    assert found.reads == []    # e.g. ["item at attnkit/train.py:412 (train_step)"] when one crept in

What counts, at two levels of the dispatcher:

* asked from Python: a value (``item``, ``bool``/``int``/``float``/``index`` of a tensor), its host
  copy (``tolist``, ``numpy``, ``cpu``);
* reached by an operation: a value read inside an operator (``_local_scalar_dense``), and the operations
  whose output's size depends on the values (``nonzero``, ``masked_select``, indexing with a boolean
  mask, ``unique``, ``bincount``, ``repeat_interleave`` without its ``output_size``), which must read
  them before they can allocate.

Tensors that live on the host by design cannot be told apart on a CPU, where every tensor does. One
kind is exempt, by where it is read: torch's recurrent layers read a ``PackedSequence``'s
``batch_sizes``, which torch keeps on the host (our packing builds them from the batch's host copy of
its lengths, :func:`attnkit.encoders.text.pack_from_host_lengths`). ``.to(device)`` is not counted: on
a CPU run it cannot be told from moving a batch onto the GPU.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# Asked from Python (Tensor methods, as __torch_function__ names them).
VALUE_READS = frozenset({"item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__", "__array__"})
# Reached inside operators (aten names): a value read, or an output whose size depends on the values.
VALUE_DEPENDENT_OPERATIONS = frozenset({"_local_scalar_dense", "nonzero", "masked_select", "_unique", "_unique2", "unique_dim", "unique_consecutive", "bincount"})
INDEXING = frozenset({"index", "index_put", "index_put_", "_index_put_impl_"})

# Reads by torch's recurrent layers: of PackedSequence.batch_sizes, on the host by design.
_HOST_BY_DESIGN = "/torch/nn/modules/rnn.py"
_THIS = str(Path(__file__)).replace("\\", "/")


def _reader() -> tuple[str, int, str] | None:
    """(path, line, function) of the innermost frame of the code that asked for the read: not this module, and
    not torch's own machinery (dispatch, modes, dynamo), though torch.nn's modules and functions are kept."""
    for frame in reversed(traceback.extract_stack()):
        path = frame.filename.replace("\\", "/")
        if path == _THIS or ("/torch/" in path and "/torch/nn/" not in path):
            continue
        return path, frame.lineno, frame.name
    return None


def _is_boolean_mask(index) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)


class HostReads:
    """Records each host read of a tensor's values (see the module's docstring) as ``"what at file:line
    (function)"``, the file shortened to start at its package; ``with HostReads() as found: ...`` then
    ``found.reads``. Reads inside a read (``item``'s own ``_local_scalar_dense``) count once."""

    def __init__(self):
        self.reads: list[str] = []
        self.within_read = 0  # > 0 while a read asked from Python runs: the operators it reaches are that read
        self._modes = (_AskedFromPython(self), _ReachedByOperators(self))

    def __enter__(self) -> HostReads:
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)

    def record(self, what: str) -> None:
        reader = _reader()
        if reader is None:
            self.reads.append(what)
            return
        path, line, function = reader
        if path.endswith(_HOST_BY_DESIGN):
            return
        for package in ("/attnkit/", "/torch/", "/tests/", "/bench/"):  # the name from its package on: enough to find it
            if package in path:
                path = package.strip("/") + "/" + path.rsplit(package, 1)[1]
                break
        self.reads.append(f"{what} at {path}:{line} ({function})")


class _AskedFromPython(TorchFunctionMode):
    def __init__(self, found: HostReads):
        super().__init__()
        self.found = found

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name not in VALUE_READS:
            return func(*args, **(kwargs or {}))
        self.found.record(name)
        self.found.within_read += 1
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.found.within_read -= 1


class _ReachedByOperators(TorchDispatchMode):
    def __init__(self, found: HostReads):
        super().__init__()
        self.found = found

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.found.within_read:
            name = func.overloadpacket.__name__
            if name in VALUE_DEPENDENT_OPERATIONS:
                self.found.record(name)
            elif name == "repeat_interleave" and func._overloadname == "Tensor" and kwargs.get("output_size") is None:  # repeats given as a tensor
                self.found.record("repeat_interleave without output_size")
            elif name in INDEXING and any(_is_boolean_mask(index) for index in (args[1] or ())):
                self.found.record(f"{name} with a boolean mask")
        return func(*args, **kwargs)
