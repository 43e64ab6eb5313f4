"""A small abstract interpreter for transformers modeling code.

It runs ``__init__`` methods concretely against the model's configuration
(so ``nn.Linear(..., bias=config.attention_bias)`` becomes a Linear with or
without a bias, per layer), and ``forward`` methods symbolically: tensors are
:class:`~autoport_cst.research.interp.values.Node` graphs of the operations
applied to the inputs, so an analysis can ask "is the MLP input computed from
the attention output" or "is this norm applied to the sublayer output before
the residual add".

Rules of the approximation (what it does not know it leaves unknown):

- ``if`` on a value it can compute (config flags, layer indices) takes one
  branch; on anything else both branches are followed as separate paths;
- loops over concrete sequences are unrolled (a bounded number of times),
  loops over tensors run their body once;
- calls to classes of the source construct ``Instance`` objects (running
  their ``__init__``); calls to methods of ``self`` are inlined; calls to
  submodules and to functions in ``forward`` become nodes;
- every read of a configuration attribute is logged, so an analysis can name
  the config key that holds a value (``eps=config.layer_norm_eps``).

Nothing is imported from transformers or torch: the code is only read.

The modules, from the bottom up:

- ``values``: what the interpreter computes with (``UNKNOWN``, ``Node``,
  ``Instance``, ``Param``, class and function references, path ``State``);
- ``config_proxy``: the configuration, every attribute read logged;
- ``walk``: the graph helpers the analyses use on computed values;
- ``operators``: Python's operators, comparisons and truth on those values;
- ``externals``: names from outside the source (``torch.nn`` modules, tensor
  factories, ``math``, ``copy``, activations);
- ``core``: the interpreter's state (configuration, read log, depth) and
  what its parts call across modules;
- ``python_builtins``: the builtins the modeling code calls;
- ``classes``: name resolution, classes (MRO, methods, class attributes) and
  construction;
- ``expressions``: expression evaluation, attribute access, comprehensions;
- ``statements``: statements and control flow (paths, branches, loops);
- ``calls``: calls (binding, inlining, call nodes) and bound builtins;
- ``interpreter``: :class:`~autoport_cst.research.interp.interpreter.Interpreter`,
  all of the above.

This package imports nothing itself.
"""
