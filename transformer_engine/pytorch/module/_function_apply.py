"""Calling a module's autograd.Function without the Python layer of ``Function.apply``.

``torch.autograd.Function.apply`` is a Python classmethod in front of the C++ one
(``torch._C._FunctionBase.apply``): it asks whether functorch transforms (vmap, grad)
are active and, when none is, passes every argument through
``_functorch.utils.unwrap_dead_wrappers`` before calling the C++ apply. For the eight
arguments of te.Linear's Function that Python layer cost a tiny FP8 training step about
10 us of its ~164 us of host time (benchmarks/bench_host_overhead.py, CPU), more than any
single piece of the module's own forward.

``direct_apply(cls)`` returns a function that calls the C++ apply straight away, and
``cls.apply`` itself whenever the Python layer matters: under functorch transforms (its
``custom_function_call`` path), while torch.compile traces (dynamo knows
``Function.apply``, not the C++ one), and in a PyTorch without the C++ classmethod.
What is skipped then is only the unwrapping of "dead" functorch wrappers: tensors that
escaped a vmap / grad that has finished, which a module's forward does not receive.
"""

from __future__ import annotations

from typing import Callable, Type

import torch

__all__ = ["direct_apply"]


def direct_apply(function_class: Type[torch.autograd.Function]) -> Callable:
    """``function_class.apply`` without its Python layer (see the module docstring)."""
    python_apply = function_class.apply
    c_apply_descriptor = getattr(torch._C, "_FunctionBase", object).__dict__.get("apply")
    if c_apply_descriptor is None:  # another PyTorch layout: the documented path only
        return python_apply
    c_apply = c_apply_descriptor.__get__(None, function_class)
    transforms_active = torch._C._are_functorch_transforms_active
    is_compiling = torch.compiler.is_compiling

    def apply(*args):
        if transforms_active() or is_compiling():
            return python_apply(*args)
        return c_apply(*args)

    return apply
