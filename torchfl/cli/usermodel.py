"""MODEL as the plan commands take it (a zoo name or ``path/to/file.py:factory``), loaded and
checked so that whatever a user's model gets wrong is one line, never its traceback.

``plan explain`` and the what-if commands (``plan memory|max-batch|compare|...``) share it. A
user's mistake raises :class:`~torchfl.planner.zoo.ModelError` (what, where, the fix); the
commands print it as ``Error: ...`` with exit 1 before they touch a registry or write a file.
torch is imported inside the functions (the CLI's cold start).
"""

from __future__ import annotations

# the check run (run_error) is skipped above this many parameter and input elements (4 GB in
# float32): a forward of such a model on the CPU costs more than the planning it guards
RUN_CHECK_ELEMENTS = 1 << 30


def load_user_model(model: str, *, labels: dict | None = None, **sizes):
    """``(module, example_inputs)`` of ``model``; ``sizes`` are ``load_model``'s options
    (``batch``, ``seq_len``, ``num_heads``, ``layers``), ``labels`` how the caller spells them.
    A user's factory that raises, returns no module or no tensors, or whose forward fails on its
    example inputs raises ModelError; the zoo's own factories are torchfl's (their errors are bugs)."""
    import torch

    from torchfl.planner.whatif import example_error
    from torchfl.planner.zoo import LM_ZOO, ZOO, ModelError, load_model

    if model in ZOO or model in LM_ZOO:
        return load_model(model, labels=labels, **sizes)
    try:
        module, inputs = load_model(model, labels=labels, **sizes)
    except ModelError:
        raise
    except SystemExit as exc:   # the user's file or factory ended the process: said, not silent
        raise ModelError(f"the model file or factory {model} called sys.exit({exc.code!r}){_user_frame(exc, model)}; "
                         "a factory returns (module, example_inputs)") from None
    except Exception as exc:  # noqa: BLE001 - user code: anything it raises is the user's to fix
        raise ModelError(f"the model factory {model} raised {type(exc).__name__}: "
                         f"{_first_line(exc)}{_user_frame(exc, model)}") from None
    if not isinstance(module, torch.nn.Module):
        raise ModelError(f"{model} returned {type(module).__name__} as the module; return (module, example_inputs) "
                         "with a torch.nn.Module first")
    if not isinstance(inputs, (tuple, list)) or not any(isinstance(x, torch.Tensor) for x in inputs):
        raise ModelError(f"{model} returned {type(inputs).__name__} as example_inputs; return a tuple of the "
                         "tensors the module's forward takes, e.g. (torch.randn(1, 3, 224, 224),)")
    inputs = tuple(inputs)
    fake = example_error(module, inputs)
    real = run_error(module, inputs, checked=fake is not None)
    if real:   # the fake run's words where both fail (they name the shapes as the graph sees them)
        raise ModelError(f"{model}: {fake or real}; fix the factory's example inputs or the model")
    if fake:
        # it runs, but not on shapes alone: it reads tensor values (an `if` on a tensor, .item(), nonzero)
        raise ModelError(f"{model}: the forward depends on tensor values, so it cannot be captured as one graph "
                         f"({fake.split('): ', 1)[-1]}); remove data-dependent Python "
                         "control flow, or run it through torch.compile(model, backend=\"torchfl\"), which splits "
                         "the graph there")
    return module, inputs


def run_error(module, inputs, checked: bool = False) -> str | None:
    """Why ``module(*inputs)`` fails when it really runs, or None.

    The fake-tensor run (``whatif.example_error``) checks shapes, but not every op's dtypes: a
    Linear given int64 inputs passes it, and was planned (a CPU fallback that could never run).
    One forward on the CPU under ``no_grad`` settles it; the module's buffers (a train-mode
    batch-norm's statistics) and the RNG are restored after it, so the plan sees the model as
    the factory built it. Skipped for models on the meta device or another device, and above
    :data:`RUN_CHECK_ELEMENTS` unless ``checked`` (the fake run failed: whether the real one does
    too tells a wrong input from a forward that reads tensor values)."""
    import torch

    tensors = [*module.parameters(), *module.buffers(), *(x for x in inputs if isinstance(x, torch.Tensor))]
    if any(t.device.type != "cpu" for t in tensors) or (
            not checked and sum(t.numel() for t in tensors) > RUN_CHECK_ELEMENTS):
        return None
    saved = [(b, b.detach().clone()) for b in module.buffers()]
    rng = torch.random.get_rng_state()
    try:
        with torch.no_grad():
            module(*inputs)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # noqa: BLE001 - user code: anything it raises is the user's to fix
        return f"the model's forward fails on its example inputs ({_shapes(inputs)}): " \
               f"{type(exc).__name__}: {_first_line(exc)}"
    finally:
        with torch.no_grad():
            for buf, copy in saved:
                buf.copy_(copy)
        torch.random.set_rng_state(rng)
    return None


def _shapes(inputs) -> str:
    import torch

    return ", ".join(f"{tuple(x.shape)} {str(x.dtype).removeprefix('torch.')}" if isinstance(x, torch.Tensor)
                     else type(x).__name__ for x in inputs)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0]


def _user_frame(exc: BaseException, model: str) -> str:
    """`` (at file.py:LINE)``: the innermost frame of the traceback in the user's model file."""
    import traceback

    path = model.rsplit(":", 1)[0]
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.endswith(path.split("/")[-1])]
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
