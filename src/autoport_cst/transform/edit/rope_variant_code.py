"""The code rope-scaling adds to a rotary embedding for each RoPE frequency
variant, as snippets parsed into the model file: the Python scalars every
variant sets in ``__init__``, the ``_setup_<variant>`` methods (YaRN,
LongRoPE), the static variants' branch of ``_compute_inv_freq`` (linear,
YaRN), and the length-dependent variants' branch of ``forward`` with the
method it calls (dynamic NTK, LongRoPE). Semantics of transformers'
``ROPE_INIT_FUNCTIONS``; tensors are only built in ``forward`` and
``_compute_inv_freq`` (lazy rule)."""

from __future__ import annotations

# Scalars read in __init__ by every variant (Python values only: lazy rule).
COMMON_INIT = {
    "max_position_embeddings": "self.max_position_embeddings = {config}.max_position_embeddings",
    "attention_scaling": "self.attention_scaling = 1.0",
}

SETUP = {
    "yarn": '''
def _setup_yarn(self, config, scaling):
    """YaRN's frequency band and attention factor, as Python scalars: the
    band (in rotated dimensions) between beta_fast and beta_slow rotations
    over the original context blends interpolated and original frequencies."""
    original = scaling.get("original_max_position_embeddings") or config.original_max_position_embeddings
    factor = scaling.get("factor")
    if factor is None:
        factor = config.max_position_embeddings / original
    self.scaling_factor = float(factor)

    def mscale(scale, coefficient=1.0):
        return 1.0 if scale <= 1 else 0.1 * coefficient * math.log(scale) + 1.0

    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        if scaling.get("mscale") and scaling.get("mscale_all_dim"):
            attention_factor = mscale(factor, scaling["mscale"]) / mscale(factor, scaling["mscale_all_dim"])
        else:
            attention_factor = mscale(factor)
    self.attention_scaling = float(attention_factor)

    def correction_dim(rotations):
        return (self.head_dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(self.rope_theta))

    low = correction_dim(scaling.get("beta_fast") or 32)
    high = correction_dim(scaling.get("beta_slow") or 1)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    self.yarn_low = max(low, 0)
    self.yarn_high = min(high, self.head_dim - 1)
    if self.yarn_low == self.yarn_high:
        self.yarn_high += 0.001
''',
    "longrope": '''
def _setup_longrope(self, config, scaling):
    """LongRoPE's per-frequency factors (short within the original context,
    long beyond it) and attention factor, as Python scalars."""
    original = scaling.get("original_max_position_embeddings") or config.original_max_position_embeddings
    self.original_max_position_embeddings = int(original)
    self.long_factor = [float(f) for f in scaling["long_factor"]]
    self.short_factor = [float(f) for f in scaling["short_factor"]]
    factor = scaling.get("factor")
    if factor is None:
        factor = config.max_position_embeddings / original
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        if factor <= 1.0:
            attention_factor = 1.0
        else:
            attention_factor = math.sqrt(1 + math.log(factor) / math.log(original))
    self.attention_scaling = float(attention_factor)
''',
}

COMPUTE_BRANCH = {
    "linear": """
if self.rope_type == "linear":
    inv_freq = inv_freq / self.scaling_factor
""",
    "yarn": """
if self.rope_type == "yarn":
    ramp = (torch.arange(self.head_dim // 2, dtype=torch.float32, device=device) - self.yarn_low) / (
        self.yarn_high - self.yarn_low
    )
    extrapolation = 1 - torch.clamp(ramp, 0, 1)
    inv_freq = (inv_freq / self.scaling_factor) * (1 - extrapolation) + inv_freq * extrapolation
""",
}

FORWARD_BRANCH = {
    "dynamic": """
if self.rope_type == "dynamic":
    inv_freq = self._dynamic_ntk_inv_freq(inv_freq, {positions})
""",
    "longrope": """
if self.rope_type == "longrope":
    inv_freq = self._longrope_inv_freq(inv_freq, {positions})
""",
}

FORWARD_METHOD = {
    "dynamic": '''
def _dynamic_ntk_inv_freq(self, inv_freq, position_ids):
    """Dynamic NTK: beyond max_position_embeddings the base grows with the
    sequence length (the step's last position + 1, kept as a tensor)."""
    seq_len = position_ids.max().to(torch.float32) + 1
    limit = float(self.max_position_embeddings)
    factor = self.scaling_factor
    base = self.rope_theta * (
        (factor * torch.clamp(seq_len, min=limit) / limit) - (factor - 1)
    ) ** (self.head_dim / (self.head_dim - 2))
    exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=inv_freq.device)
    scaled = 1.0 / (base ** (exponents.to(torch.float32) / self.head_dim))
    return torch.where(seq_len > limit, scaled, inv_freq)
''',
    "longrope": '''
def _longrope_inv_freq(self, inv_freq, position_ids):
    """LongRoPE: each frequency divided by its short factor, or by its long
    factor once the sequence (the step's last position + 1) outgrows the
    original context."""
    seq_len = position_ids.max() + 1
    long_factor = torch.tensor(self.long_factor, dtype=torch.float32, device=inv_freq.device)
    short_factor = torch.tensor(self.short_factor, dtype=torch.float32, device=inv_freq.device)
    factors = torch.where(seq_len > self.original_max_position_embeddings, long_factor, short_factor)
    return inv_freq / factors
''',
}

SCALED = ("yarn", "longrope")
# variants whose code reads self.scaling_factor without setting it
FACTOR_READERS = ("linear", "dynamic")
