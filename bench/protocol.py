"""Protocol benchmark: what Declarative Attention costs the engine per decoding step, and the trainer per batch.

Three measurements, in one process, on one synthetic protocol-following completion stream (``<global>``,
``<focus magic_chunks="3,5">`` and ``<local>`` segments of a few dozen words each, tokenized with the
byte-level BPE tokenizer from ``data.tokenizer.build_tokenizer``) and one DA prompt laid out with
``rollouts.protocol.build_prompt`` (about 32K tokens, 16 magic chunks, block size 32):

1. Per decoding step, "parse the newest token + the visible KV block list the engine hands to attention":
   Heed's ``VisibilityTracker.advance(token_id)`` against the peer package ``declarative-attention``
   (lucidrains, PyPI 0.0.8): ``DeclarativeAttention.step(token_id)`` + ``get_kept_blocks(total_len)``.
   The peer gets the same chunk spans and block size, and a precomputed decode function (a list lookup
   into the same per-token byte table Heed uses), so no tokenizer call is timed on either side.
2. Parse alone: Heed's ``TokenTextStream`` + ``ProtocolParser.feed`` against the peer's ``step``.
   Then both are run in lockstep and compared (mode, and the exact kept-block list) on every
   ``--check-stride``-th step and at every tag completion and the step before it.
3. Training masks for a batch of ``--batch`` rows of ``--seq-len`` tokens (prompts of about
   ``--train-prompt`` tokens, each with its own context and completion): ``trace_completion``,
   ``mask_batch``, ``dense_training_mask`` (SDPA) and ``block_training_mask`` (FlexAttention BlockMask on
   CPU): build seconds, bytes held, and the peak resident memory the build adds.

Each time is one ``time.perf_counter`` span around a whole loop; per-token costs divide it by the token count.
Left out on purpose: the attention kernels and vLLM itself (copying the block list into the engine's
block table is the same work for both packages).

The peer package is installed for this benchmark only (it is not a dependency of Heed)::

    .venv/bin/pip install --no-deps declarative-attention==0.0.8 torch-einops-utils==0.2.0

Run::

    .venv/bin/python -m bench.protocol                    # the recorded run (about a minute on 2 cores, 6 GB peak)
    .venv/bin/python -m bench.protocol --tokens 10000 --seq-len 2048 --train-prompt 1536   # quick, ~10 s
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import threading
import time

import numpy as np
import psutil
import torch

from data.tokenizer import build_tokenizer, word_list
from rl.environment import this_cpu
from rollouts.masks import (
    VisibilityTracker,
    block_training_mask,
    dense_training_mask,
    mask_batch,
    trace_completion,
)
from rollouts.protocol import ProtocolParser, TokenTextStream, build_prompt, token_bytes_table

PEER_INSTALL = ".venv/bin/pip install --no-deps declarative-attention==0.0.8 torch-einops-utils==0.2.0"
QUESTION = "In which year was the company in the report founded, and who founded it?"

# -- synthetic prompt and completion ---------------------------------------------------------------


def filler(tokenizer, rng: random.Random, n_tokens: int) -> str:
    """A context document of about ``n_tokens`` tokens: sentences from the shipped word list, in paragraphs."""
    words, out, count = word_list(), [], 0
    while count < n_tokens:  # a word is one token or more, so this overshoots; cut below
        n = rng.randint(4, 14)
        sentence = " ".join(rng.choice(words) for _ in range(n)).capitalize() + rng.choice(".?!;.")
        out.append(sentence + ("\n\n" if rng.random() < 0.15 else " "))
        count += n
    ids = tokenizer("".join(out), add_special_tokens=False)["input_ids"][:n_tokens]
    return tokenizer.decode(ids).strip()


def completion_text(rng: random.Random, num_chunks: int, n_words: int) -> str:
    """A well-formed DA completion: mode segments of 15-60 words each, a few dozen tokens apart."""
    words, parts, count = word_list(), [], 0
    while count < n_words:
        n = rng.randint(15, 60)
        body = " ".join(rng.choice(words) for _ in range(n))
        if rng.random() < 0.3:
            body += f", so {rng.randint(1, 9999)} - {rng.randint(1, 999)} = {rng.randint(1, 9999)}."
        mode = rng.choice(("global", "focus", "focus", "local"))
        if mode == "focus":
            ids = sorted(rng.sample(range(1, num_chunks + 1), k=rng.randint(1, min(3, num_chunks))))
            parts.append(f'<focus magic_chunks="{",".join(map(str, ids))}">{body}</focus>\n')
        else:
            parts.append(f"<{mode}>{body}</{mode}>\n")
        count += n
    return "".join(parts)


def completion_ids(tokenizer, rng: random.Random, num_chunks: int, n_tokens: int) -> list[int]:
    ids: list[int] = []
    while len(ids) < n_tokens:  # words are about one token each; top up if the estimate falls short
        text = completion_text(rng, num_chunks, n_tokens - len(ids) + 64)
        ids += tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids[:n_tokens]


def da_prompt(tokenizer, rng: random.Random, prompt_tokens: int, num_chunks: int, block_size: int):
    """A DA prompt of about ``prompt_tokens`` tokens: ``num_chunks`` documents of equal size."""
    # The scaffold takes about 640 tokens plus about 80 per chunk (tool call, tool message, block padding).
    per_chunk = max(1, (prompt_tokens - 640) // num_chunks - 80)
    docs = [filler(tokenizer, rng, per_chunk) for _ in range(num_chunks)]
    # chunk_tokens above each document's length: one document, one magic chunk
    return build_prompt(QUESTION, docs, tokenizer, block_size=block_size, chunk_tokens=2 * per_chunk)


# -- measuring -------------------------------------------------------------------------------------


class PeakRSS:
    """Peak resident memory of this process while the block runs, sampled every millisecond."""

    def __enter__(self):
        self._proc = psutil.Process()
        self.start = self.peak = self._proc.memory_info().rss
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._done.wait(0.001):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)

    @property
    def added(self) -> int:
        return self.peak - self.start


def heed_advance(layout, table, ids) -> float:
    tracker = VisibilityTracker(layout, table)
    advance = tracker.advance
    t0 = time.perf_counter()
    for token_id in ids:
        advance(token_id)
    return time.perf_counter() - t0


def heed_parse(layout, table, ids) -> float:
    text = TokenTextStream(table)
    feed = ProtocolParser(layout.num_chunks, thinking=layout.thinking, has_index=layout.has_index).feed
    t0 = time.perf_counter()
    for token_id in ids:
        piece = text(token_id)
        if piece:
            feed(piece)
    return time.perf_counter() - t0


def peer_machine(layout, decode):
    from declarative_attention import DeclarativeAttention

    spans = {i: span for i, span in enumerate(layout.chunk_spans, start=1)}
    return DeclarativeAttention(chunk_spans=spans, tokenizer_decode=decode, block_size=layout.block_size)


def peer_step_and_blocks(layout, decode, ids) -> float:
    machine = peer_machine(layout, decode)
    step, kept_blocks = machine.step, machine.get_kept_blocks
    first_len = layout.prompt_len + 1  # the forward of g_j reads prompt_len + j + 1 KV positions
    t0 = time.perf_counter()
    for j, token_id in enumerate(ids):
        step(token_id)
        kept_blocks(first_len + j)
    return time.perf_counter() - t0


def peer_step(layout, decode, ids) -> float:
    step = peer_machine(layout, decode).step
    t0 = time.perf_counter()
    for token_id in ids:
        step(token_id)
    return time.perf_counter() - t0


def agreement(layout, table, decode, ids, stride: int) -> dict[str, tuple[int, int]]:
    """Run both in lockstep; compare mode and kept-block list on sampled steps and around every mode change.

    Returns ``{kind of step: (steps that agree, steps checked)}``.
    """
    row_state = trace_completion(layout, ids, table).row_state
    changes = np.flatnonzero(np.diff(row_state)) + 1  # steps whose token completes a mode-changing tag
    kinds = {
        f"every {stride}th step": set(range(0, len(ids), stride)),
        "steps completing a mode change": set(changes.tolist()),
        "steps just before one": set((changes - 1).tolist()),
    }
    check = set().union(*kinds.values())
    tracker, machine = VisibilityTracker(layout, table), peer_machine(layout, decode)
    agrees = set()
    for j, token_id in enumerate(ids):
        blocks = tracker.advance(token_id)
        machine.step(token_id)
        if j in check:
            theirs = machine.get_kept_blocks(layout.prompt_len + j + 1)
            if tracker.state.mode == machine.mode and blocks.tolist() == theirs:
                agrees.add(j)
    return {kind: (len(steps & agrees), len(steps)) for kind, steps in kinds.items()}


def blockmask_bytes(block_mask) -> int:
    tensors = (getattr(block_mask, name, None) for name in type(block_mask)._TENSOR_ATTRS)
    return sum(t.nbytes for t in tensors if isinstance(t, torch.Tensor))


# -- report ----------------------------------------------------------------------------------------


def mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=100_000, help="completion tokens in the decode stream")
    parser.add_argument("--prompt-tokens", type=int, default=32_768, help="approximate DA prompt length")
    parser.add_argument("--chunks", type=int, default=16, help="magic chunks in the prompt")
    parser.add_argument("--block-size", type=int, default=32, help="KV block size of the engine")
    parser.add_argument(
        "--peer-tokens", type=int, default=0, help="time the peer on this prefix of the stream (0: all of it)"
    )
    parser.add_argument("--check-stride", type=int, default=97, help="agreement check every N-th step")
    parser.add_argument("--batch", type=int, default=8, help="training mask rows")
    parser.add_argument("--seq-len", type=int, default=8192, help="training row length")
    parser.add_argument("--train-prompt", type=int, default=6144, help="approximate training prompt length")
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="best of N for the sub-second loops (peer step+blocks runs once)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    print(
        f"machine: {platform.machine()}, {this_cpu()}, {os.cpu_count()} cores, "
        f"python {platform.python_version()}, torch {torch.__version__}"
    )
    rng = random.Random(args.seed)
    tokenizer = build_tokenizer()
    table = token_bytes_table(tokenizer)
    layout = da_prompt(tokenizer, rng, args.prompt_tokens, args.chunks, args.block_size)
    ids = completion_ids(tokenizer, rng, layout.num_chunks, args.tokens)
    n_tags = sum(tokenizer.decode(ids).count(t) for t in ("<global>", "<focus ", "<local>"))
    print(
        f"prompt: {layout.prompt_len} tokens, {layout.num_chunks} magic chunks, block size {layout.block_size} "
        f"({layout.num_blocks} blocks); stream: {len(ids)} tokens, {n_tags} mode segments "
        f"(one every {len(ids) / max(n_tags, 1):.0f} tokens), vocab {len(tokenizer)}"
    )

    # 1 + 2: per decoding step -----------------------------------------------------------------------
    # One torch thread: the peer's per-step work is a handful of small torch ops, and an intra-op thread
    # pool on a busy 2-core machine made each call 10-50x slower. Heed's tracker does not use torch.
    train_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    t_advance = min(heed_advance(layout, table, ids) for _ in range(args.repeat))
    t_parse = min(heed_parse(layout, table, ids) for _ in range(args.repeat))
    try:
        import declarative_attention  # noqa: F401

        have_peer = True
    except ImportError:
        have_peer = False
        print(
            f"\ndeclarative-attention is not installed; its columns are skipped. Install it with:\n  {PEER_INSTALL}"
        )

    print(
        f"\nper decoding step (best of {args.repeat}, except peer step + get_kept_blocks: one run; 1 torch thread)"
    )
    print("                                                      tokens    total s    us/token")
    row = "  {:<50} {:>7} {:>10.3f} {:>11.2f}"
    print(row.format("heed  VisibilityTracker.advance", len(ids), t_advance, 1e6 * t_advance / len(ids)))
    print(
        row.format("heed  TokenTextStream + ProtocolParser.feed", len(ids), t_parse, 1e6 * t_parse / len(ids))
    )
    if have_peer:
        # A list lookup: the peer gets text per token at no cost (the same bytes Heed decodes incrementally).
        decode = [b.decode("utf-8", errors="replace") for b in table].__getitem__
        peer_ids = ids[: args.peer_tokens] if args.peer_tokens else ids
        t_peer = peer_step_and_blocks(layout, decode, peer_ids)
        t_peer_step = min(peer_step(layout, decode, ids) for _ in range(args.repeat))
        peer_us, peer_step_us = 1e6 * t_peer / len(peer_ids), 1e6 * t_peer_step / len(ids)
        print(row.format("peer  step + get_kept_blocks", len(peer_ids), t_peer, peer_us))
        print(row.format("peer  step", len(ids), t_peer_step, peer_step_us))
        if len(peer_ids) < len(ids):
            print(f"  (peer step + get_kept_blocks timed on the first {len(peer_ids)} tokens of the stream)")
        print("  peer tokenizer_decode: precomputed per-token text (list lookup), same byte table as heed")
        advance_x = peer_us / (1e6 * t_advance / len(ids))
        parse_x = peer_step_us / (1e6 * t_parse / len(ids))
        print(f"\n  advance vs step + get_kept_blocks: heed {advance_x:.1f}x faster  (target >= 10x)")
        print(f"  parse vs step:                     heed {parse_x:.1f}x faster  (target >= 1x)")
        print("  agreement, same mode and same kept-block list:")
        for kind, (same, checked) in agreement(layout, table, decode, ids, args.check_stride).items():
            print(f"    {kind:<32} {same:>6}/{checked}")
    print(f"  heed advance target <= 5 us/token: {'met' if 1e6 * t_advance / len(ids) <= 5 else 'MISSED'}")

    # 3: training masks ------------------------------------------------------------------------------
    torch.set_num_threads(train_threads)
    layouts, completions = [], []
    for b in range(args.batch):
        row_rng = random.Random(args.seed + 1 + b)
        chunks = 4 + b % 5  # rows differ in chunk count, context and completion
        layouts.append(
            da_prompt(tokenizer, row_rng, args.train_prompt - 256 * (b % 3), chunks, args.block_size)
        )
    max_prompt = max(lay.prompt_len for lay in layouts)
    if max_prompt + 24 * args.batch >= args.seq_len:
        parser.error(
            f"prompts of up to {max_prompt} tokens leave no room for completions in --seq-len {args.seq_len}; "
            "lower --train-prompt (prompts cannot go much below 1000 tokens) or raise --seq-len"
        )
    for b, lay in enumerate(layouts):
        n = max(0, args.seq_len - max_prompt - 24 * b)  # right padding grows along the batch
        completions.append(completion_ids(tokenizer, random.Random(100 + b), lay.num_chunks, n))

    print(
        f"\ntraining masks ({train_threads} torch threads): batch {args.batch} x {args.seq_len} tokens; prompts "
        f"{min(lay.prompt_len for lay in layouts)}-{max_prompt} tokens (left-padded), completions "
        f"{min(map(len, completions))}-{max(map(len, completions))} tokens"
    )
    row3 = "  {:<52} {:>8} {:>12} {:>15}"
    print(row3.format("", "build s", "bytes held", "peak RSS added"))
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        traces = [trace_completion(lay, c, table) for lay, c in zip(layouts, completions)]
        t_trace = time.perf_counter() - t0
    print(row3.format(f"trace_completion x {args.batch}", f"{t_trace:.3f}", "", mib(mem.added)))
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        batch = mask_batch(traces, [max_prompt - lay.prompt_len for lay in layouts], args.seq_len)
        t_batch = time.perf_counter() - t0
    batch_bytes = sum(
        t.nbytes for t in (batch.state_keys, batch.query_state, batch.valid, batch.position_ids)
    )
    print(row3.format("mask_batch (MaskBatch tensors)", f"{t_batch:.3f}", mib(batch_bytes), mib(mem.added)))
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        block = block_training_mask(batch, device="cpu")
        t_block = time.perf_counter() - t0
    closed_over = sum(t.nbytes for t in (batch.state_keys, batch.query_state, batch.valid))
    print(
        row3.format(
            "block_training_mask (BlockMask, 128-token blocks)",
            f"{t_block:.3f}",
            mib(blockmask_bytes(block)),
            mib(mem.added),
        )
    )
    print(row3.format("  + MaskBatch tensors its mask_mod closes over", "", mib(closed_over), ""))
    del block
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        dense = dense_training_mask(batch)
        t_dense = time.perf_counter() - t0
    print(
        row3.format(
            f"dense_training_mask {tuple(dense.shape)} bool",
            f"{t_dense:.3f}",
            mib(dense.nbytes),
            mib(mem.added),
        )
    )
    print(f"  states per row: {[len(t.states) for t in traces]}")


if __name__ == "__main__":
    main()
