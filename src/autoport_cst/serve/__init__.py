"""Serving a port with real vLLM on CPU (workflow steps 8 and 9).

A vLLM platform plugin (``plugin``, ``platform``, ``worker``, ``runner``)
serves a port written by ``apply`` on the CPU stand-in of the vllm_neuron
API, the way the vLLM Neuron plugin serves it on Trainium: the port is built
through its own ``vllm_neuron/model/registry.py`` and driven by vLLM's
scheduler, and vLLM's sampler samples. ``smoke`` runs the workflow's offline
smoke test and OpenAI-server battery against transformers.

vLLM is imported only by the modules of this package that run inside vLLM
(``platform``, ``worker``, ``runner``, ``vllm_model``) and by the smoke
driver's child process; everything else here imports without it.
"""
