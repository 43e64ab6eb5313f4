"""The spec decision, one module per spec section (``decoder``,
``attention``, ``rope``, ``mlp``, ``moe``, ``head``, ``checkpoint``) plus
``unsupported``, over the shared ``state`` (the findings of every source,
and the decisions, conflicts, unknowns and notes being collected).
:mod:`autoport_cst.research.crosscheck` runs them in order; imports point
from it down to the sections and from the sections to ``state``. This
package imports nothing itself."""
