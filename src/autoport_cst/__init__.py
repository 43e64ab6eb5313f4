"""autoport-cst: port Hugging Face decoder models to the vLLM Neuron backend.

Layers, top to bottom (imports point downward only):

- ``autoport_cst.cli``: click commands, rich output, exit codes.
- ``autoport_cst.apply``: load a reference package, compose codemods from the
  architecture diff, run them, post-check, write atomically, register.
- ``autoport_cst.codemods``: the codemod library, one codemod per file.
- ``autoport_cst.transform``: the codemod framework and shared CST helpers.
- ``autoport_cst.plan``: plan.json (model identity, reference, target spec, steps).
- ``autoport_cst.spec``: the typed architecture spec and the diff of two specs.

``apply`` and everything below it import neither torch nor transformers.
"""

__version__ = "0.1.0"
