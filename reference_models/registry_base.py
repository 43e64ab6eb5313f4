# SPDX-License-Identifier: Apache-2.0
"""Registry of the vLLM Neuron model implementations.

``get_models()`` returns ``(Hugging Face architecture string, model class)``
pairs. The serving engine looks a checkpoint up by ``config.json``'s
``architectures[0]``, which must match the string exactly, case included.
"""


def get_models() -> list[tuple[str, type]]:
    models = []
    return models
