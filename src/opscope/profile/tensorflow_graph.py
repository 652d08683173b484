"""Graph helpers of the TensorFlow phase marks (:mod:`opscope.profile.tensorflow_marks`):
which tensors a mark waits for, gates, and where an optimizer's update starts."""

from __future__ import annotations

from typing import Any

SOURCES = ("Const", "Placeholder")  # a constant; a captured handle (the function's input)


def hold_roots(stamp: Any, update: list[Any]) -> None:
    """Make the update's first ops wait for ``stamp``, so that the ops needing no gradient
    (the step counter's and learning rate's reads, bias corrections: ~40% of AdamW's op time
    on a small model) run inside the optimizer phase, not during the forward pass.

    Only the roots: ops that read nothing the update made but constants and captured
    handles (the function's inputs), variable reads included. Left free: ops of constants
    only, which Grappler folds: a control input on those stopped the folding and cost ~6% of
    the benchmark's Keras step (1.064x against 0.999x-1.005x, measured)."""
    if stamp is None:
        return
    inner = [op for op in update if op.type not in SOURCES]
    made = set(inner)
    for op in inner:
        inputs = [t.op for t in op.inputs]
        if any(i in made for i in inputs) or (inputs and all(i.type == "Const" for i in inputs)):
            continue  # waits through its inputs; foldable (casts of constants)
        op._add_control_input(stamp.op)


def is_graph_tensor(tf: Any, value: Any) -> bool:
    return isinstance(value, (tf.Tensor, tf.Operation)) and not isinstance(value, tf.__internal__.EagerTensor)


def flat_tensors(tf: Any, structure: Any) -> list[Any]:
    """Graph tensors (and ops) in a nested structure; IndexedSlices by their values;
    optionals by their variant tensor."""
    out = []
    for item in tf.nest.flatten(structure, expand_composites=True):
        if isinstance(item, tf.Operation) or (isinstance(item, tf.Tensor) and is_graph_tensor(tf, item)):
            out.append(item)
    return out


def probe(tf: Any, values: list[Any]) -> list[Any]:
    """What a mark waits for: operations (the optimizer's updates) as they are, tensors
    through one IdentityN that reads them all. A control edge straight from the op that made
    a tensor would stop Grappler from fusing that op with its producers (MatMul + BiasAdd),
    and a fused op rounds differently in bfloat16: the numbers would change."""
    ops = [v for v in values if isinstance(v, tf.Operation)]
    tensors = [v for v in values if not isinstance(v, tf.Operation)]
    if tensors:
        ops.append(tf.raw_ops.IdentityN(input=tensors)[0].op)
    return ops


def identity(tf: Any, value: Any) -> Any:
    if isinstance(value, tf.IndexedSlices):
        return tf.IndexedSlices(tf.identity(value.values), value.indices, value.dense_shape)
    if isinstance(value, tf.Tensor) and is_graph_tensor(tf, value):
        return tf.identity(value)
    return value


def symbolic(args: Any) -> bool:
    """Keras builds models on symbolic KerasTensors: no step runs there."""
    from keras.src.backend.common.keras_tensor import KerasTensor

    return any(isinstance(a, KerasTensor) for a in flatten_any(args))


def flatten_any(args: Any) -> list[Any]:
    from keras.src import tree

    try:
        return list(tree.flatten(args))
    except Exception:  # noqa: BLE001 - an unflattenable argument is not a KerasTensor
        return []


def bp_gradients(tf: Any, sources: Any, grads: Any, variables: set[int]) -> list[Any] | None:
    """The gradients of the ``bp_point`` layer's variables, or None when none is among them."""
    flat_sources = tf.nest.flatten(sources)
    flat_grads = tf.nest.flatten(grads, expand_composites=False)
    chosen = []
    for source, grad in zip(flat_sources, flat_grads):
        if id(source) in variables and grad is not None:
            chosen.extend(flat_tensors(tf, grad))
    return chosen or None


def default_graph() -> Any:
    from tensorflow.python.framework import ops

    return ops.get_default_graph()


def outermost_graph(graph: Any) -> Any:
    """The graph of the tf.function called from eager code that (maybe through nested
    functions and control flow) holds ``graph``."""
    from tensorflow.python.framework.func_graph import FuncGraph

    while isinstance(getattr(graph, "outer_graph", None), FuncGraph):
        graph = graph.outer_graph
    return graph
