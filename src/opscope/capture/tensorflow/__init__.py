"""opscope.capture.tensorflow: TensorFlow / Keras capture (see docs/tensorflow.md).

- :mod:`.tracing` — an op callback that plans, while a ``tf.function`` is traced, which
  tensors each op reads and writes, and one host callback per traced graph that receives
  them all when the graph runs (``jit_compile`` graphs are left alone: XLA refuses it);
- :mod:`.context` — the Keras layer stack, the phase (gradient tape = backward, optimizer
  ``apply`` = optimizer) and parameter names, by patching three methods while dumping;
- :mod:`.rows` — plans and arrays into opscope records; :mod:`.stats` — statistics;
- :mod:`.session` — ``opscope.tensorflow.dump``; :mod:`.keras` — the Keras callback.
"""
