"""Which part of a model runs in which precision under mixed precision, made explicit and checkable.

The rule (docs/scaling.md's "Mixed precision, part by part" table says the same):

* matrix products, convolutions and attention run in the autocast dtype (bf16 or fp16) where
  autocast puts them;
* **recurrent layers run in fp32, outside autocast** (the bi-GRU/LSTM text encoder, the RNN
  decoder's cells): autocast sends cuDNN's GRU/LSTM to fp16 whatever dtype was asked
  (``_cudnn_rnn`` casts to half in PyTorch's sources), and with bf16 no GradScaler runs, so they
  would otherwise train in unscaled fp16;
* the loss (log-softmax, cross-entropy, the attention terms) is computed in fp32;
* cached image features do not depend on the precision: they are computed and stacked outside
  autocast (:mod:`attnkit.data.features`), stored in fp16 and upcast on the device.

:class:`PrecisionProbe` records the dtypes the operations really ran in, per part of a model, as the
dispatcher sees them after autocast: what ``bench/gpu_smoke.py`` prints and the tests check.
:class:`OperationCount` counts a step's operations and the casts among them: what mixed precision adds to it.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

AUTOCAST_DEVICE_TYPES = ("cpu", "cuda")


def without_autocast() -> contextlib.ExitStack:
    """Autocast switched off on every device type where it is on, for work that must run in the dtype of its
    inputs: recurrent layers (fp32), and image features that are cached whatever the training precision."""
    stack = contextlib.ExitStack()
    for device_type in AUTOCAST_DEVICE_TYPES:
        if torch.is_autocast_enabled(device_type):
            stack.enter_context(torch.autocast(device_type, enabled=False))
    return stack


def to_fp32(value: Any) -> Any:
    """A tensor (or a tuple of them, e.g. an LSTM's (h, c); None stays None) as float32, for a recurrent layer."""
    if isinstance(value, tuple):
        return tuple(to_fp32(v) for v in value)
    return value.float() if isinstance(value, torch.Tensor) else value


# The operations whose dtype tells the precision of a part: products, convolutions, recurrences, attention, norms.
WATCHED = (
    "mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "convolution", "cudnn_convolution", "mkldnn_convolution", "conv2d",
    "gru", "lstm", "gru_cell", "lstm_cell", "_cudnn_rnn", "mkldnn_rnn_layer", "_thnn_fused_gru_cell", "_thnn_fused_lstm_cell",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu", "scaled_dot_product_attention", "native_layer_norm", "_log_softmax", "_softmax",
)  # fmt: skip


class PrecisionProbe(TorchDispatchMode):
    """Records, per part of ``model`` and per watched operation, the dtypes of its floating inputs as they reach
    the kernels (after autocast's casts): ``{"decoder.rnn": {"gru_cell": ["float32"]}, ...}``.

    ``parts``: the names of submodules to attribute operations to: an operation that reads a part's own parameter
    belongs to that part (so an RNN's cells, called with its weights outside its ``forward``, count as the RNN);
    any other to the innermost part running; operations outside every named part go to "other".
    Use as ``with PrecisionProbe(model, parts) as probe: ...``.
    """

    def __init__(self, model: nn.Module, parts: list[str]):
        super().__init__()
        self.seen: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        self._running: list[str] = []
        self._hooks = []
        modules = dict(model.named_modules())
        self._owner: dict[int, str] = {}
        for name in sorted(parts, key=lambda part: part.count(".")):  # deeper parts claim their parameters last
            self._owner.update((id(parameter), name) for parameter in modules[name].parameters())
        for name in parts:
            module = modules[name]
            self._hooks.append(module.register_forward_pre_hook(lambda _m, _a, name=name: self._running.append(name)))
            self._hooks.append(module.register_forward_hook(self._leave))

    def _leave(self, *_) -> None:  # returns None: a forward hook's value would replace the module's output
        self._running.pop()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in WATCHED:
            tensors = [a for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.Tensor) and a.is_floating_point()]
            tensors += [t for a in args if isinstance(a, (list, tuple)) for t in a if isinstance(t, torch.Tensor) and t.is_floating_point()]
            owners = [self._owner[id(t)] for t in tensors if id(t) in self._owner]
            part = owners[0] if owners else self._running[-1] if self._running else "other"
            self.seen[part][name].update(str(t.dtype).removeprefix("torch.") for t in tensors)
        return func(*args, **(kwargs or {}))

    def __exit__(self, *exc):
        for hook in self._hooks:
            hook.remove()
        return super().__exit__(*exc)

    def report(self) -> dict[str, dict[str, list[str]]]:
        return {part: {op: sorted(dtypes) for op, dtypes in sorted(ops.items())} for part, ops in sorted(self.seen.items())}


class OperationCount(TorchDispatchMode):
    """The operations that reach a kernel (views, which launch none, are left out) and the casts among them
    (``_to_copy`` into another dtype: autocast's casts of weights and activations, their gradients' casts back,
    and the recurrent layers' way to fp32), as the dispatcher sees them after autocast, forward and backward.
    Where a GPU waits on its launches (a small model), a step's time follows its operations, so the casts that
    bf16 adds are time it can lose. Use as ``with OperationCount() as count: ...``."""

    def __init__(self):
        super().__init__()
        self.operations = 0
        self.casts = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            self.operations += 1
            if func.overloadpacket is torch.ops.aten._to_copy and out.dtype != args[0].dtype:  # not a copy to another device
                self.casts += 1
        return out
