"""Stand-in for ``nkilib.core.utils.common_types``: the enums NF ops take."""

from __future__ import annotations

import enum


class ActFnType(enum.Enum):
    SiLU = "silu"
    Swish = "swish"
    GELU = "gelu"
    GELU_Tanh_Approx = "gelu_tanh_approx"


class NormType(enum.Enum):
    NO_NORM = "no_norm"
    RMS_NORM = "rms_norm"
    LAYER_NORM = "layer_norm"


class RouterActFnType(enum.Enum):
    SOFTMAX = "softmax"
    SIGMOID = "sigmoid"


class ExpertAffinityScaleMode(enum.Enum):
    NO_SCALE = "no_scale"
    POST_SCALE = "post_scale"
    PRE_SCALE = "pre_scale"
    # the kernels' fourth mode: refused by every stand-in that takes a mode (moe_blockwise, moe_decode_block)
    PRE_SCALE_DELAYED = "pre_scale_delayed"


class QuantizationType(enum.Enum):
    NONE = "none"
    STATIC = "static"
    ROW = "row"
    BLOCK = "block"


class QKVOutputLayout(enum.Enum):
    BSD = "bsd"
    NBSd = "nbsd"
    NBdS = "nbds"


class QKVWeightLayout(enum.Enum):
    CONTIGUOUS = "contiguous"
