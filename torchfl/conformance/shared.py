"""One compile of a case group for several chips.

What a chip does not change is done once: Dynamo traces the group's function once (one
``torch.compile`` with a backend that hands each chip's call to that chip's graph), and the
planner captures the traced graph once (``capture_dynamo``: torch.export and the core-ATen
decompositions, most of a case's cost). Each chip then runs the torchfl backend's own
:class:`~torchfl.runtime.backend.CompiledGraph` (what ``torch.compile(backend="torchfl")``
builds) strictly, planning the shared capture on its target. The checks a chip makes before
any capture (precision, the inputs' layouts) still come first, so a chip refuses exactly as
it would alone.
"""

from __future__ import annotations

from torchfl.runtime.backend import CompiledGraph, Options, recording


class _Once:
    """The value (or the exception) of the first ``get(make)``, for every later call too."""

    def __init__(self):
        self.done = False
        self.value = self.error = None

    def get(self, make):
        if not self.done:
            try:
                self.value = make()
            except Exception as exc:  # noqa: BLE001 - kept and raised to every chip that asks, as each would raise it
                self.error = exc
            self.done = True
        if self.error is not None:
            raise self.error
        return self.value


class ChipGraph(CompiledGraph):
    """The backend's graph for one chip, planning a capture shared with the other chips."""

    def __init__(self, gm, options: Options, lifted: _Once, captured: _Once):
        super().__init__(gm, options, "inference")
        self.lifted, self.captured = lifted, captured

    def _plan(self, args):
        if self.symbolic:   # dynamic=False: not expected; the backend's own path if it happens
            return super()._plan(args)
        from torchfl.planner import plan_captured, resolve_target
        from torchfl.planner.capture import capture_dynamo, lift_static
        from torchfl.planner.constraints import check_layout_inputs, check_precision
        from torchfl.planner.errors import MutatesInputs

        o = self.options
        lifted, user = self.lifted.get(lambda: lift_static(self.gm, args))
        inputs = tuple(args[i] for i in user)
        target = resolve_target(o.chip, o.registry)
        check_precision(target.hcd, o.precision)       # as planner.plan_dynamo: before the capture
        check_layout_inputs(target.hcd, inputs)
        captured = self.captured.get(lambda: capture_dynamo(lifted, inputs))
        plan = plan_captured(captured, inputs, target, o.precision, o.strict)
        if len(plan.outputs) != _n_outputs(self.gm):
            raise MutatesInputs(f"the graph returns {_n_outputs(self.gm)} values but writes to some of its "
                                "inputs too")
        return plan, user


def _n_outputs(gm) -> int:
    import torch

    out = next(n for n in gm.graph.nodes if n.op == "output")
    return len(torch.utils._pytree.tree_leaves(out.args[0]))


class GroupCompile:
    """``fn(*leaves)`` compiled once; :meth:`run` calls it on one chip, strictly."""

    def __init__(self, fn, leaves, registry=None):
        import torch

        torch._dynamo.reset()   # compiled afresh: Dynamo stops recompiling one function after a few shapes
        self.leaves = list(leaves)
        self.registry = registry
        self.chip = None
        self.traces = 0        # graphs Dynamo handed over: one for every chip
        self.trace_error = None
        self._captured = None   # the last trace's shared capture (a _Once)
        self.compiled = torch.compile(fn, backend=self._backend, fullgraph=True, dynamic=False)

    def _backend(self, gm, _example_inputs):
        self.traces += 1
        per_chip: dict = {}
        lifted, captured = _Once(), _Once()
        self._captured = captured

        def call(*args):
            key = self.chip if isinstance(self.chip, str) else id(self.chip)   # a name, or a Target
            graph = per_chip.get(key)
            if graph is None:
                options = {"chip": self.chip, "strict": True}
                if self.registry is not None:
                    options["registry"] = self.registry
                graph = per_chip[key] = ChipGraph(gm, Options.parse(options), lifted, captured)
            return graph(*args)

        return call

    @property
    def captured(self):
        """The planner's capture of the last graph traced (node names as refusals give them), or None."""
        c = self._captured
        return c.value if c is not None and c.done and c.error is None else None

    def run(self, chip):
        """(result, plans, refusal or error) of the call on ``chip``: a Dynamo error (raised
        before any graph reached a backend) is the same for every chip and is not traced again."""
        import torch

        from torchfl.conformance.cases import _copied

        if self.trace_error is not None:
            return None, [], self.trace_error
        self.chip = chip
        args = _copied(list(self.leaves))
        with recording(False) as rec, torch.no_grad():
            try:
                got = self.compiled(*args)
            except Exception as exc:  # noqa: BLE001 - returned, not swallowed: the caller reports a refusal or a fail
                if not self.traces:
                    self.trace_error = exc
                return None, [], exc
        return got, [plan for _cg, plan, _r in rec.entries], None
