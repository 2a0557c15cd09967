"""Greedy decoding under KV budgets by verification: how the budget search's accuracy judge decodes.

The search (:mod:`rl.selective.budgets`) measures hundreds of candidate budgets that differ by a few tokens
of one layer, and between two candidates most greedy completions do not change. Decoding every candidate
token by token (the reference engine: one forward per token, one request at a time) spends most of its
time finding completions already known. Here a candidate starts from drafts, the completions decoded under
the nearest budgets decoded before (the search's current budgets, which the candidate lowers by one step),
and checks a batch of drafts in one forward with the eviction replayed
(:class:`~rollouts.selective.attention.AttentionState` with budgets, under the DA mask that
:func:`rl.logprobs.pack` builds: the trainer's forward, which replays what a decoding loop evicts):

    forward [prompt | draft] of a batch under the DA mask, every layer evicting under the budgets
    p_j = argmax of the logits that predict completion token j        (j = 0 .. len(draft))
    k   = the first j with p_j != draft_j
    none, and the draft ends in a stop token or holds max_tokens:  the draft is the greedy completion
    else: the reference engine decodes the row, forced through draft[:k] + [p_k] (the prefix confirmed)

So a draft that holds costs its share of one batched forward, and one that changed costs that plus the
token-by-token decode it would have cost anyway. The first call has no drafts: the reference engine decodes
every row. What comes out is the reference engine's greedy completion up to float ties: a batched forward
rounds differently from a one-token forward, so two logits within about 1e-6 of each other may swap (the
tests compare the two token for token). Greedy ``da`` requests only: a sampled completion has no argmax to
check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from rl.logprobs import pack
from rollouts.engines.base import RolloutRequest, build_trajectory
from rollouts.engines.reference import ReferenceEngine
from rollouts.masks import trace_completion
from rollouts.selective.attention import AttentionState
from rollouts.selective.eviction import check_budgets
from rollouts.trajectory import Trajectory


class VerifiedGreedy:
    """Greedy ``da`` completions of fixed ``requests`` under any budgets, each call starting from the
    completions of the nearest budgets decoded before (module docstring)."""

    def __init__(self, model, tokenizer, requests: Sequence[RolloutRequest], batch_size: int = 8):
        for request in requests:
            if request.mode != "da" or request.temperature != 0 or request.num_forced:
                raise ValueError("VerifiedGreedy decodes greedy `da` requests without forced tokens only")
        self.model, self.tokenizer, self.requests = model, tokenizer, list(requests)
        self.batch_size = batch_size
        reference = ReferenceEngine(model, tokenizer)  # the engine's stop tokens and byte table, not two
        self.stop_ids, self.token_table = reference.stop_ids, reference.token_table
        self.known: dict[tuple[int, ...], list[list[int]]] = {}  # budgets -> completions decoded under them
        self.decoded = 0

    def generate(self, budgets: Sequence[int]) -> list[Trajectory]:
        """One greedy trajectory per request, every layer ``l`` holding at most ``budgets[l]`` tokens (as
        many as the longest request evicts nothing). ``decoded``: how many rows the reference engine
        decoded (their drafts changed, or there were none)."""
        budgets = check_budgets(budgets, self.model.config.num_hidden_layers)
        engine = ReferenceEngine(self.model, self.tokenizer, budgets=budgets, num_threads=1)
        if not self.known:
            self.drafts = [list(t.completion_ids) for t in engine.generate(self.requests)]
            self.decoded = len(self.requests)
            return self._remember(budgets)
        nearest = min(self.known, key=lambda known: sum(abs(a - b) for a, b in zip(known, budgets)))
        self.drafts = [list(ids) for ids in self.known[nearest]]
        changed = {}  # row -> the prefix its forward confirmed, ending in the first changed token
        for start in range(0, len(self.requests), self.batch_size):
            rows = range(start, min(start + self.batch_size, len(self.requests)))
            predicted = self._argmax(
                [self.requests[i] for i in rows], [self.drafts[i] for i in rows], budgets
            )
            for i, p in zip(rows, predicted):
                draft = self.drafts[i]
                k = next((j for j, token in enumerate(draft) if p[j] != token), len(draft))
                if k < len(draft) or not self._finished(draft, self.requests[i].num_tokens):
                    changed[i] = [*draft[:k], p[k]]
        # a confirmed prefix already finished needs no decoding (and a forced stop token would not end it)
        undecided = [
            i for i, prefix in changed.items() if not self._finished(prefix, self.requests[i].num_tokens)
        ]
        for i, prefix in changed.items():
            self.drafts[i] = prefix
        forced = [replace(self.requests[i], forced_ids=tuple(changed[i])) for i in undecided]
        for i, trajectory in zip(undecided, engine.generate(forced)):
            self.drafts[i] = list(trajectory.completion_ids)
        self.decoded = len(undecided)
        return self._remember(budgets)

    def _remember(self, budgets: tuple[int, ...]) -> list[Trajectory]:
        """Keep the completions decoded under ``budgets`` (drafts for later calls), as trajectories."""
        self.known[budgets] = self.drafts
        return [
            build_trajectory(r, ids, None, self.token_table, finish_reason=self._finish_reason(ids))
            for r, ids in zip(self.requests, self.drafts)
        ]

    def _finish_reason(self, ids: list[int]) -> str:
        return "stop" if ids and ids[-1] in self.stop_ids else "length"

    @torch.no_grad()
    def _argmax(self, requests, drafts, budgets: tuple[int, ...]) -> list[list[int]]:
        """Per row, the greedy token after each prefix of its draft: ``len(draft) + 1`` tokens."""
        traces = [trace_completion(r.layout, draft, self.token_table) for r, draft in zip(requests, drafts)]
        packed = pack(traces, drafts, self.tokenizer.pad_token_id)
        width = packed.completion_mask.shape[1]
        prompt_lens = torch.tensor([r.layout.prompt_len for r in requests])
        prompt_real = torch.arange(packed.prompt_width) >= packed.prompt_width - prompt_lens[:, None]
        real = torch.cat([prompt_real, packed.completion_mask], 1)  # [b, P + width]: the tokens, not padding
        logits = self.model(
            input_ids=packed.input_ids,
            attention_mask=packed.attention_mask,
            position_ids=packed.position_ids,
            logits_to_keep=width + 1,  # position P + j - 1 predicts completion token j, j = 0 .. width
            use_cache=False,
            heed_state=AttentionState(budgets=budgets, padding_mask=real),
        ).logits  # [b, width + 1, V]
        best = logits.argmax(-1).tolist()
        return [best[b][: len(draft) + 1] for b, draft in enumerate(drafts)]

    def _finished(self, ids: list[int], limit: int) -> bool:
        """Ends in a stop token, or holds ``limit`` tokens."""
        return bool(ids) and (ids[-1] in self.stop_ids or len(ids) >= limit)
