"""The choice of the stand-in ``Sampler`` (``layers.Sampler``) among its
candidates, with the semantics of ``vllm_neuron.functional.sample`` (read in
the public vllm-neuron sources, ``functional/sampling.py`` and
``functional/topk.py``; written here, not copied):

- the candidates are the ``cap`` largest logits of the row, ``cap`` being
  ``min(max_top_k, shard width)`` (the distributed top-k takes that many
  from each shard, offsets each shard's ids by the rank it is given, and
  keeps the ``cap`` largest of what it gathered), in descending order;
- a row's ``sampling_params`` are ``(top_k, top_p, temperature)``: top-k
  (when > 0) drops the candidates below the k-th, the temperature divides the
  logits (a row below ``GREEDY_BELOW`` is greedy and divided by 1), then a
  softmax, then top-p drops the candidates after the cumulative probability
  passes p (the first is always kept) and the rest is renormalized;
- a greedy row takes the most probable candidate; any other row draws by
  inverse transform of the cumulative distribution at a random point, or at
  0.5 when the config is ``deterministic``.

The stand-in computes what that returns and refuses what it cannot know: a
random draw among several candidates (``deterministic`` off). A draw that can
land on one candidate only (top-k 1, or a top-p that keeps the first) is the
same at every random point, so it is computed. Ties between equal logits are
broken by the lower id, on every shard and in the gathered candidates alike,
so that the choice over the gathered shards is the choice over the whole
vocabulary (``full_vocabulary_choice``)."""

from __future__ import annotations

import torch

GREEDY_BELOW = 1e-5  # vllm_neuron's sample(): a row whose temperature is below this is greedy
DRAW_AT = 0.5  # the random point of a deterministic draw (vllm_neuron's _multinomial)


def ordered(values: torch.Tensor, ids: torch.Tensor, cap: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``cap`` largest ``values`` of each row with their ``ids``, in
    descending order, equal values by ascending id."""
    by_id = ids.argsort(dim=-1, stable=True)
    values, ids = values.gather(-1, by_id), ids.gather(-1, by_id)
    order = values.argsort(dim=-1, descending=True, stable=True)[..., :cap]
    return values.gather(-1, order), ids.gather(-1, order)


def greedy_params(rows: int) -> torch.Tensor:
    """``sampling_params`` of ``rows`` greedy requests, as the runner stacks
    them ``[rows, 3]`` (top_k, top_p, temperature): top-k off (-1), top-p 1,
    temperature 0."""
    return torch.tensor([[-1.0, 1.0, 0.0]]).repeat(rows, 1)


def choose(
    values: torch.Tensor, ids: torch.Tensor, params: torch.Tensor, deterministic: bool
) -> torch.Tensor:
    """The token of each row: ``values`` / ``ids`` its candidates
    (``ordered``), ``params`` ``[rows, 3]``."""
    values = values.float()
    top_k = params[:, 0].to(torch.int64).unsqueeze(-1)
    top_p = params[:, 1].float().unsqueeze(-1)
    temperature = params[:, 2].float()
    greedy = temperature < GREEDY_BELOW
    kth = values.gather(-1, (top_k - 1).clamp(0, values.shape[-1] - 1))
    values = values.masked_fill((values < kth) & (top_k > 0), float("-inf"))
    scaled = values / torch.where(greedy, torch.ones_like(temperature), temperature).unsqueeze(-1)
    probs = torch.softmax(scaled, dim=-1)
    beyond = probs.cumsum(dim=-1) > top_p
    beyond[:, 0] = False
    probs = probs.masked_fill(beyond, 0.0)
    probs = probs / probs.sum(dim=-1, keepdim=True)
    index = probs.argmax(dim=-1)
    drawn = ~greedy
    if bool(drawn.any()):
        index = torch.where(greedy, index, _drawn(probs, drawn, params, deterministic))
    return ids.gather(-1, index.unsqueeze(-1)).squeeze(-1)


def _drawn(
    probs: torch.Tensor, drawn: torch.Tensor, params: torch.Tensor, deterministic: bool
) -> torch.Tensor:
    """The candidate each row draws (inverse transform of its cumulative
    distribution)."""
    if not deterministic:
        several = drawn & ((probs > 0).sum(dim=-1) > 1)
        if bool(several.any()):
            rows = several.nonzero().reshape(-1).tolist()
            k, p, t = (float(v) for v in params[rows[0]])
            raise NotImplementedError(
                f"the stand-in Sampler cannot draw at random: row(s) {rows[:8]} sample among several "
                f"tokens (top_k {k:g}, top_p {p:g}, temperature {t:.3g}) with the sampling config's "
                "deterministic off, where vllm_neuron's sample() draws at a random point"
            )
        return torch.zeros(probs.shape[0], dtype=torch.int64)
    cdf = probs.cumsum(dim=-1)
    cdf = cdf / cdf[:, -1:]
    cdf[:, -1] = 1.0
    return (DRAW_AT > cdf).sum(dim=-1)


def full_vocabulary_choice(
    logits: torch.Tensor,
    params: torch.Tensor | None,
    logit_mask: torch.Tensor | None,
    cap: int,
    deterministic: bool,
) -> torch.Tensor:
    """What a sampler of candidate cap ``cap`` returns for the rows of
    ``logits`` ``[rows, V]`` (every id of the vocabulary, ids from 0) with
    ``params`` (None: greedy) and ``logit_mask`` (its first ``V`` columns;
    False = disallowed)."""
    if logit_mask is not None:
        logits = logits.masked_fill(~logit_mask[:, : logits.shape[-1]], float("-inf"))
    if params is None:
        params = greedy_params(logits.shape[0])
    ids = torch.arange(logits.shape[-1]).expand(logits.shape[0], -1)
    values, ids = ordered(logits.float(), ids, cap)
    return choose(values, ids, params, deterministic)
