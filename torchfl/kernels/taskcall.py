"""Calling a compiled task through its address: its machine code is generated once.

A jitted function that calls another links the callee's library into its own and Numba
optimises (O3) and generates machine code for the linked module whole: a large per-task
body that a parallel kernel calls in its ``prange`` loop is compiled for itself, then
again inside the gufunc's library, and once more inside the outer function's. Here the
caller receives the task's native address as an integer argument and calls it through a
pointer (:func:`call`): nothing is linked, so the task is compiled once, by its own
dispatcher (cached, and claimed across processes like any kernel, see ``compilelock``),
and the parallel kernel only compiles its loop. The address is an argument, not a
constant, so the caller stays cacheable.

    addr = address(_task, (np.int64(0), nq, Q, ...))     # the task's argument values, as called
    _kernel(addr, nq, Q, ...)                             # jitted: call(addr, (np.int64(t), nq, Q, ...))

The caller must pass the task exactly the values :func:`address` was given (same types):
:func:`address` keys the signature by Numba's ``typeof`` of each value, and :func:`call`
checks at compile time that the tuple it receives has no literal or optional members.
"""
from __future__ import annotations

from numba import typeof
from numba._dispatcher import compute_fingerprint
from numba.core import cgutils, types
from numba.extending import intrinsic

__all__ = ["address", "call"]

_addresses: dict = {}


def address(task, args: tuple) -> int:
    """Native address of ``task`` (a ``@njit`` dispatcher returning nothing) compiled for the
    types of ``args`` (compiled or loaded from the cache on first use, then memoised under
    the values' type fingerprints: ~3 us a call, where ``typeof`` of 28 values took ~75 us)."""
    key = (task, tuple(map(compute_fingerprint, args)))
    addr = _addresses.get(key)
    if addr is None:
        sig = tuple(typeof(a) for a in args)
        task.compile(sig)
        cres = task.overloads[sig]
        if cres.signature.return_type != types.none:
            raise TypeError(f"{task.py_func.__qualname__}: a task returns nothing, not {cres.signature.return_type}")
        addr = cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)
        _addresses[key] = addr
    return addr


@intrinsic
def call(typingctx, addr, args):
    """``task(*args)`` where ``addr`` = :func:`address` of ``task`` for these argument types.
    A status other than success (the task raised) is ignored: tasks do not raise."""
    if not isinstance(addr, types.Integer) or not isinstance(args, types.BaseTuple):
        return None
    for t in args:
        if isinstance(t, (types.Literal, types.Optional)):
            raise TypeError(f"taskcall.call: argument type {t} (pass np.int64(...) / a plain value)")

    def codegen(context, builder, signature, llargs):
        fnty = context.call_conv.get_function_type(types.none, list(args))
        fnptr = builder.inttoptr(llargs[0], fnty.as_pointer())
        values = [builder.extract_value(llargs[1], i) for i in range(len(args))]
        retty = fnty.args[0].pointee
        ret = cgutils.alloca_once(builder, retty)
        builder.store(cgutils.get_null_value(retty), ret)
        excinfo = cgutils.alloca_once(builder, fnty.args[1].pointee, name="excinfo")
        packed = context.call_conv._get_arg_packer(list(args)).as_arguments(builder, values)
        builder.call(fnptr, [ret, excinfo] + list(packed))
        return context.get_dummy_value()

    return types.none(addr, args), codegen

