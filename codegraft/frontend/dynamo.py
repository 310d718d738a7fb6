"""``torch.compile(model, backend="codegraft")``: each FX graph dynamo hands over, compiled by codegraft.

Registered through torch's own entry point for dynamo backends (the ``torch_dynamo_backends``
group in ``pyproject.toml``), so ``backend="codegraft"`` works without importing codegraft
first.  Dynamo keeps what it owns (graph breaks, guards, recompiles); for each graph this
module:

- splits the graph's inputs into the user's tensors, the module's parameters and buffers
  (lifted to inputs by dynamo; here they become the ONNX model's constants, so backends can
  pack weights) and symbolic sizes (recomputed from the tensors they come from);
- exports the graph with torch's dynamo exporter, the symbolic dimensions dynamic, and
  compiles it with :func:`codegraft.compile` (``options`` are ``targets`` plus any
  :class:`~codegraft.CompileOptions` field);
- runs it from torch tensors: CPU memory is shared with numpy both ways, not copied.  A
  static-shape backend (``c``) compiles each partition once per input shape it meets and
  caches it, so calls at a shape already seen compile nothing.

A graph codegraft cannot take (export or compile fails) runs eagerly in torch, logged, or
raises with ``options={"strict": True}``.  Inference only: outputs carry no autograd history.
Parameters changed in place after compiling (a training step) are noticed by their version
counters and the graph is compiled again.

Example::

    compiled = torch.compile(model, backend="codegraft", dynamic=True,
                             options={"targets": ["c"], "min_partition_size": 2})
    with torch.no_grad():
        y = compiled(x)
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from codegraft.errors import CodegraftError
from codegraft.frontend.torch_export import first_line

log = logging.getLogger("codegraft")

_SERIAL = itertools.count()
_COMPILED: weakref.WeakSet[_CompiledGraph] = weakref.WeakSet()


def compiled_graphs() -> list[Any]:
    """The executables of the graphs compiled so far (alive), oldest first: ``print(e.report())``.

    Example::

        torch.compile(model, backend="codegraft", options={"targets": ["c"]})(x)
        for exe in compiled_graphs():
            print(exe.report())
    """
    return [graph.exe for graph in sorted(_COMPILED, key=lambda g: g.serial)]

_INPUT, _STATIC, _SIZE, _SCALAR = "input", "static", "size", "scalar"


@dataclass(frozen=True)
class _Slot:
    """Where one graph input comes from: a user tensor, a parameter/buffer, or a tensor's size."""

    kind: str
    index: int  # user-input position (input, size), static position (static), scalar position (scalar)
    axis: int = 0  # for a size: which dimension of user input ``index``


def codegraft_backend(
    gm: Any, example_inputs: Sequence[Any], *, options: Mapping[str, Any] | None = None, mode: str | None = None
) -> Callable[..., Any]:
    """The dynamo backend: ``gm`` (an FX GraphModule) and its example inputs in, a callable out."""
    settings = dict(options or {})
    targets = settings.pop("targets", ())
    strict = bool(settings.get("strict", False))
    try:
        graph = _CompiledGraph(gm, list(example_inputs), targets, settings)
    except Exception as error:
        if strict:
            raise
        log.warning("codegraft could not compile a torch.compile graph (%s: %s); it runs in torch instead",
                    type(error).__name__, first_line(error))
        return gm.forward  # type: ignore[no-any-return]
    return graph


class _CompiledGraph:
    """One dynamo graph as a codegraft executable, called with the graph's flat inputs."""

    def __init__(self, gm: Any, example_inputs: list[Any], targets: Any, settings: dict[str, Any]) -> None:
        import torch

        self._gm = gm
        self._targets = targets
        self._settings = settings
        self._lock = threading.Lock()
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(example_inputs):
            raise CodegraftError(f"the graph has {len(placeholders)} inputs, dynamo gave {len(example_inputs)}")
        self._slots, self._statics, self._scalars, user = _classify(torch, placeholders, example_inputs)
        self._user_fakes = [placeholders[i].meta.get("example_value") for i in user]
        self._user_examples = [example_inputs[i] for i in user]
        self._versions = [(id(t), t._version) for t in self._statics]
        self.exe = self._compile()
        self.serial = next(_SERIAL)
        _COMPILED.add(self)

    def _compile(self) -> Any:
        import torch

        import codegraft

        module = _graph_module_class()(_fold_scalars(self._gm, self._slots, self._scalars), self._slots, self._statics)
        names = [f"input_{i}" for i in range(len(self._user_examples))]
        # torch.export traces with a tracing context of its own: dynamo's (still open while it
        # builds this frame's guards) must not see the export's guards, or it rejects its own frame.
        with torch._guards.tracing(None):
            return codegraft.compile(
                module,
                self._targets,
                example_inputs=tuple(self._user_examples),
                dynamic_shapes=tuple(_dynamic_axes(fake) for fake in self._user_fakes),
                input_names=names,
                **self._settings,
            )

    def __call__(self, *args: Any) -> tuple[Any, ...]:
        statics = [args[i] for i, slot in enumerate(self._slots) if slot.kind == _STATIC]
        scalars = [args[i].item() for i, slot in enumerate(self._slots) if slot.kind == _SCALAR]
        if [(id(t), t._version) for t in statics] != self._versions or scalars != self._scalars:
            with self._lock:  # weights replaced or changed in place: never run stale constants
                if [(id(t), t._version) for t in statics] != self._versions or scalars != self._scalars:
                    log.info("codegraft: parameters changed since this graph was compiled; compiling it again")
                    self._statics, self._scalars = statics, scalars
                    self._versions = [(id(t), t._version) for t in statics]
                    self.exe = self._compile()
        users = [args[i] for i, slot in enumerate(self._slots) if slot.kind == _INPUT]
        outputs = self.exe.run(*users)
        return tuple(outputs[name] for name in self.exe.outputs)


def _classify(
    torch: Any, placeholders: list[Any], examples: list[Any]
) -> tuple[list[_Slot], list[Any], list[float], list[int]]:
    """Each graph input's slot, the static tensors, the scalars, and the graph positions of the user tensors."""
    user: list[int] = []
    statics: list[Any] = []
    scalars: list[float] = []
    kinds: list[str] = []
    for node, example in zip(placeholders, examples, strict=True):
        if isinstance(example, torch.Tensor) and getattr(node.meta.get("grapharg"), "pass_arg_as_tensor", False):
            kinds.append(_SCALAR)  # a Python number (a module's eps) dynamo passes as a 0-d tensor
        elif isinstance(example, torch.Tensor):
            kinds.append(_STATIC if _is_parameter(torch, node, example) else _INPUT)
        elif isinstance(example, int | torch.SymInt):
            kinds.append(_SIZE)
        else:
            raise CodegraftError(f"graph input {node.name} is a {type(example).__name__}, not a tensor or a size")
    slots: list[_Slot] = []
    for position, (node, example, kind) in enumerate(zip(placeholders, examples, kinds, strict=True)):
        if kind == _STATIC:
            slots.append(_Slot(_STATIC, len(statics)))
            statics.append(example.detach())
        elif kind == _INPUT:
            slots.append(_Slot(_INPUT, len(user)))
            user.append(position)
        elif kind == _SCALAR:
            slots.append(_Slot(_SCALAR, len(scalars)))
            scalars.append(example.item())
        else:
            slots.append(_size_source(node, placeholders, kinds))
    return slots, statics, scalars, user


def _is_parameter(torch: Any, node: Any, example: Any) -> bool:
    if isinstance(example, torch.nn.Parameter):
        return True
    source = getattr(node.meta.get("grapharg"), "source", None)
    name = getattr(source, "name", "") or ""
    if callable(name):
        name = name()
    return "._buffers[" in name or "._parameters[" in name


def _size_source(node: Any, placeholders: list[Any], kinds: list[str]) -> _Slot:
    """A symbolic size input as (user tensor, axis) whose dimension it is."""
    symbol = node.meta.get("example_value")
    user_index = 0
    for other, kind in zip(placeholders, kinds, strict=True):
        if kind != _INPUT:
            continue
        fake = other.meta.get("example_value")
        for axis, dim in enumerate(getattr(fake, "shape", ())):
            if str(dim) == str(symbol):
                return _Slot(_SIZE, user_index, axis)
        user_index += 1
    raise CodegraftError(f"graph input {node.name} is a size ({symbol}) that is no input tensor's dimension")


def _dynamic_axes(fake: Any) -> dict[int, Any] | None:
    """The symbolic dimensions of a graph input, as ``Dim.AUTO``.

    dynamo makes every dimension symbolic under ``dynamic=True`` and specialises some later
    (a channel count a weight fixes); AUTO lets the export keep dynamic exactly those still free.
    """
    import torch

    shape = getattr(fake, "shape", ())
    axes = {axis: torch.export.Dim.AUTO for axis, dim in enumerate(shape) if not isinstance(dim, int)}
    return axes or None


@functools.cache
def _graph_module_class() -> type:
    import torch

    class DynamoGraph(torch.nn.Module):  # type: ignore[misc]
        """The dynamo graph with its parameters as buffers (constants) and sizes from the inputs."""

        def __init__(self, gm: Any, slots: list[_Slot], statics: list[Any]) -> None:
            super().__init__()
            self.fx = gm
            self.slots = [slot for slot in slots if slot.kind != _SCALAR]  # folded into ``fx``
            for index, tensor in enumerate(statics):
                self.register_buffer(f"static_{index}", tensor)

        def forward(self, *inputs: Any) -> Any:
            args = []
            for slot in self.slots:
                if slot.kind == _INPUT:
                    args.append(inputs[slot.index])
                elif slot.kind == _STATIC:
                    args.append(getattr(self, f"static_{slot.index}"))
                else:
                    args.append(inputs[slot.index].shape[slot.axis])
            outputs = self.fx(*args)
            return tuple(outputs) if isinstance(outputs, list | tuple) else outputs

    return DynamoGraph


def _fold_scalars(gm: Any, slots: list[_Slot], scalars: list[float]) -> Any:
    """A copy of ``gm`` with the scalar inputs replaced by their values (``x.item()`` by the number).

    An exporter cannot trace ``.item()`` of an input (its value is data); these are module
    constants such as BatchNorm's eps, and a change of value compiles the graph again.
    """
    import copy

    import torch

    if not scalars:
        return gm
    graph = copy.deepcopy(gm.graph)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for node, slot in zip(placeholders, slots, strict=True):
        if slot.kind != _SCALAR:
            continue
        value = scalars[slot.index]
        for user in list(node.users):
            if user.op == "call_method" and user.target == "item":
                swap = functools.partial(_swap, old=user, new=value)
                for reader in list(user.users):
                    reader.args = torch.fx.node.map_arg(reader.args, swap)
                    reader.kwargs = torch.fx.node.map_arg(reader.kwargs, swap)
                graph.erase_node(user)
            else:
                with graph.inserting_before(user):
                    constant = graph.call_function(torch.tensor, (value,), {"dtype": node.meta["example_value"].dtype})
                user.replace_input_with(node, constant)
        graph.erase_node(node)
    return torch.fx.GraphModule(gm, graph)


def _swap(node: Any, *, old: Any, new: Any) -> Any:
    return new if node is old else node
