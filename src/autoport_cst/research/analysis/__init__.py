"""The code analysis, one module per spec section (``decoder``,
``attention``, ``rope``, ``mlp``, ``moe``, ``head``) over the shared
``state`` (the interpreter, the instance tree, the result) and the graph
helpers of ``graph`` and ``norms``. :mod:`autoport_cst.research.code_analysis`
runs the sections in order; imports point from it down to the sections and
from the sections to ``state``, ``graph`` and ``norms`` (``moe`` also uses
the MLP classifier of ``mlp`` for its experts). This package imports nothing
itself."""
