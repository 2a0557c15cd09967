"""KV memory at baseline perplexity (Selective Attention paper §4 and §6.2): Selective Attention with and
without L_mem against a standard transformer, and against H2O- / TOVA-style eviction on that transformer.

The corpus. Python source code, available offline: every ``*.py`` file under the standard library of the
interpreter that runs this script (``sysconfig.get_paths()["stdlib"]``, site-packages excluded), sorted by
path and split *by file*: file ``i`` goes to the search split when ``i % 10 == 8``, to the test split when
``i % 10 == 9``, else to training. A byte-level BPE (the ``tokenizers`` library, vocabulary 1024 by
default) is trained on the training files only. Each split is one stream, files joined by an ``<eos>``
token; a sequence is ``<bos>`` followed by ``n - 1`` consecutive tokens of that stream, so every sequence
fills the context (no padding). Training draws windows at random offsets; the search and test sets are
fixed, evenly spaced, non-overlapping windows of their streams.

The models, per context length ``n`` (trained from scratch for each ``n``, as the paper does): three
Qwen3-architecture models (pre-norm RMSNorm, SwiGLU, QK-norm, RoPE, tied embeddings) built from one config
-- ``baseline`` (``sdpa``), ``SA`` (``heed_selective``) and ``SA + L_mem`` (``heed_selective``, trained on
``LM loss + L_mem``, eps 0.1, tau 1 as in the paper). They start from the same weights (Selective
Attention adds no parameters), see the same batches in the same order, and alternate steps.

The measurement (paper §4): the baseline's full-cache loss on the search split is the target (the paper's
rule; ``--ppl-tolerance`` relaxes it to ``(1 + tol) x`` that perplexity). For each SA model,
:func:`rl.selective.budgets.greedy_budget_search` lowers one layer's budget by ``C`` = 8 tokens at a time,
always the layer whose reduction costs least on the search split, while the loss stays within the target;
the loss under budgets is :func:`rl.selective.losses.loss_under_budgets` (the paper's greedy eviction of the
most-masked token, replayed inside one forward). The reduction factor is ``n / mean budget`` (the paper's
16x at 512 is 512 / 31.3). The budgets found are then evaluated on the test split, and the baseline is run
on the test split with H2O- and TOVA-style eviction (:mod:`rollouts.selective.eviction`) under the *same*
per-layer budgets, token by token with a compacted per-layer cache
(:func:`rollouts.selective.decode.decode_with_eviction`).

What it leaves out: the paper's C4, model sizes (its smallest is d = 8, 34M parameters), training length
(524,288 steps at batch 128-256) and context lengths (512-2048). The defaults aim at about 25 minutes on 2
CPU cores shared with other jobs (the recorded run took 39 under load spikes): d_model 128, 3 layers, 4 heads
of 32 (0.92M parameters with the 1024-token vocabulary), 200 steps at batch 8, contexts 128 and 256, budget
search on 16 sequences, test on 32, one thread. H2O and TOVA get SA's budgets rather than a budget search of their own, and H2O runs without its
recent-token window (see :mod:`rollouts.selective.eviction`).

Run (the recorded numbers)::

    nice -n 15 .venv/bin/python -m bench.selective_memory
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sysconfig
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import Qwen3Config

from bench.selective_varassign import same_init_models
from rl.selective.budgets import greedy_budget_search
from rl.selective.losses import forward_with_memory_loss, loss_under_budgets
from rollouts.selective.decode import decode_with_eviction
from rollouts.selective.eviction import H2OEviction, TOVAEviction

BOS, EOS = 0, 1  # the tokenizer's two special tokens
MODELS = ("baseline", "SA", "SA + L_mem")


def corpus_files(max_files: int | None = None) -> tuple[Path, list[Path]]:
    """The standard library's ``*.py`` files (site-packages excluded), sorted by path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(f for f in root.rglob("*.py") if "site-packages" not in f.relative_to(root).parts)
    return root, files[:max_files] if max_files else files


def split_of(index: int) -> str:
    return {8: "search", 9: "test"}.get(index % 10, "train")


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<bos>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def load_corpus(args) -> dict:
    """Tokenize the standard library: ``{"streams": {split: 1D long tensor}, ...}`` plus a description."""
    root, files = corpus_files(args.max_files)
    texts = {"train": [], "search": [], "test": []}
    for index, path in enumerate(files):
        texts[split_of(index)].append(path.read_bytes().decode("utf-8", errors="replace"))
    tokenizer = train_tokenizer(texts["train"], args.vocab)
    streams = {}
    for split, parts in texts.items():
        ids = []
        for encoding in tokenizer.encode_batch(parts):
            ids += encoding.ids + [EOS]
        streams[split] = torch.tensor(ids, dtype=torch.long)
    chars = {split: sum(map(len, parts)) for split, parts in texts.items()}
    return {
        "streams": streams,
        "vocab": tokenizer.get_vocab_size(),
        "root": root,
        "files": {split: len(parts) for split, parts in texts.items()},
        "chars": chars,
    }


def with_bos(windows: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.full((windows.shape[0], 1), BOS), windows], 1)


def fixed_windows(stream: torch.Tensor, n: int, count: int) -> torch.Tensor:
    """``[count, n]``: evenly spaced non-overlapping windows of ``n - 1`` tokens, each after ``<bos>``."""
    available = (len(stream) - 1) // (n - 1)
    if available < count:
        raise ValueError(f"the split holds only {available} windows of {n - 1} tokens; asked for {count}")
    starts = torch.linspace(0, available - 1, count).long() * (n - 1)
    return with_bos(torch.stack([stream[s : s + n - 1] for s in starts.tolist()]))


def random_windows(stream: torch.Tensor, n: int, batch: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(stream) - n, (batch,), generator=gen)
    return with_bos(torch.stack([stream[s : s + n - 1] for s in starts.tolist()]))


def chunks(x: torch.Tensor, size: int) -> list[torch.Tensor]:
    return list(x.split(size))


@torch.no_grad()
def full_cache_loss(model, batches: list[torch.Tensor]) -> float:
    """Mean next-token cross-entropy with nothing evicted (any attention implementation)."""
    total, count = 0.0, 0
    for ids in batches:
        logits = model(ids).logits[:, :-1].float()
        total += float(torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="sum"))
        count += ids[:, 1:].numel()
    return total / count


@torch.no_grad()
def evicted_loss(model, batches: list[torch.Tensor], budgets, policy, desc: str) -> float:
    """Mean next-token cross-entropy when decoding token by token under ``budgets`` with ``policy``."""
    total, count = 0.0, 0
    for ids in tqdm(batches, desc=desc, unit="batch", leave=False):
        logits = decode_with_eviction(model, ids, budgets, policy).logits[:, :-1]  # [b, n-1, V]
        total += float(torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="sum"))
        count += ids[:, 1:].numel()
    return total / count


def build_models(args, vocab: int, n: int) -> dict:
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        head_dim=args.hidden // args.heads,
        max_position_embeddings=n,
        tie_word_embeddings=True,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=EOS,
    )
    baseline, selective = same_init_models(config, args.seed, num_selective=len(MODELS) - 1)
    return dict(zip(MODELS, [baseline, *selective]))


def train(models: dict, stream: torch.Tensor, n: int, args) -> dict:
    """Train the three models side by side on the same batches; returns per-model summaries."""
    optimizers = {
        name: torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
        for name, model in models.items()
    }

    def schedule(step):  # linear warm-up, then cosine down to 10%
        if step < args.warmup:
            return (step + 1) / args.warmup
        progress = (step - args.warmup) / max(1, args.steps - args.warmup)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))

    schedules = {name: torch.optim.lr_scheduler.LambdaLR(opt, schedule) for name, opt in optimizers.items()}
    gen = torch.Generator().manual_seed(args.seed + n)
    seconds = dict.fromkeys(models, 0.0)
    recent = {name: [] for name in models}  # last LM losses (and L_mem) for the summary
    recent_mem = []
    bar = tqdm(range(args.steps), desc=f"train n={n}", unit="step")
    for _ in bar:
        ids = random_windows(stream, n, args.batch, gen)
        for name, model in models.items():  # the same batch for all three, alternating
            start = time.perf_counter()
            if name == "SA + L_mem":
                outputs, l_mem = forward_with_memory_loss(model, ids, labels=ids, eps=args.eps, tau=args.tau)
                loss = outputs.loss + l_mem
                recent_mem = (recent_mem + [l_mem.item()])[-20:]
            else:
                outputs = model(ids, labels=ids)
                loss = outputs.loss
            optimizers[name].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizers[name].step()
            schedules[name].step()
            seconds[name] += time.perf_counter() - start
            recent[name] = (recent[name] + [outputs.loss.item()])[-20:]
        bar.set_postfix({name: f"{sum(v) / len(v):.2f}" for name, v in recent.items()})
    for model in models.values():
        model.eval()
    return {
        name: {
            "train_loss": sum(recent[name]) / len(recent[name]),
            "ms_per_step": 1000 * seconds[name] / max(1, args.steps),
            "l_mem": sum(recent_mem) / len(recent_mem) if name == "SA + L_mem" and recent_mem else None,
        }
        for name in models
    }


def search_budgets(model, name: str, search: list[torch.Tensor], n: int, target: float, args):
    bar = tqdm(desc=f"budget search {name} n={n}", unit="eval", leave=False)

    def loss(budgets):
        value = loss_under_budgets(model, search, budgets)
        bar.update()
        bar.set_postfix(mean_budget=f"{sum(budgets) / len(budgets):.1f}", ppl=f"{math.exp(value):.2f}")
        return value

    start = time.perf_counter()
    result = greedy_budget_search(loss, model.config.num_hidden_layers, n, target, step=args.budget_step)
    bar.close()
    return result, time.perf_counter() - start


def run_context(n: int, corpus: dict, args) -> dict:
    streams = corpus["streams"]
    search = chunks(fixed_windows(streams["search"], n, args.search_seqs), args.eval_batch)
    test = chunks(fixed_windows(streams["test"], n, args.test_seqs), args.eval_batch)
    models = build_models(args, corpus["vocab"], n)
    summary = train(models, streams["train"], n, args)

    baseline = models["baseline"]
    base_search = full_cache_loss(baseline, search)
    target = base_search + math.log1p(args.ppl_tolerance)
    rows = [
        ("baseline", "none (full cache)", (n,) * args.layers, base_search, full_cache_loss(baseline, test))
    ]
    found, searches = {}, {}
    for name in MODELS[1:]:
        model = models[name]
        full = loss_under_budgets(model, search, None)
        rows.append(
            (name, "none (full cache)", (n,) * args.layers, full, loss_under_budgets(model, test, None))
        )
        result, seconds = search_budgets(model, name, search, n, target, args)
        found[name] = result.budgets
        searches[name] = (result.evaluations, seconds)
        rows.append(
            (
                name,
                "SA, searched budgets",
                result.budgets,
                result.loss,
                loss_under_budgets(model, test, result.budgets),
            )
        )
    for source in MODELS[1:]:
        for policy_name, policy in (("H2O", H2OEviction()), ("TOVA", TOVAEviction())):
            budgets = found[source]
            loss = evicted_loss(baseline, test, budgets, policy, f"{policy_name} n={n} @ {source} budgets")
            rows.append(("baseline", f"{policy_name} @ {source} budgets", budgets, None, loss))
    return {"rows": rows, "summary": summary, "searches": searches, "target": target}


def print_table(n: int, result: dict, args) -> None:
    print()
    print(
        f"### context {n}: target search ppl {math.exp(result['target']):.3f} "
        f"(baseline full-cache search ppl x {1 + args.ppl_tolerance:g})"
    )
    print()
    print("| model | eviction | budgets per layer | mean budget | reduction | search ppl | test ppl |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for model, eviction, budgets, search_loss, test_loss in result["rows"]:
        mean = sum(budgets) / len(budgets)
        search_ppl = "--" if search_loss is None else f"{math.exp(search_loss):.3f}"
        print(
            f"| {model} | {eviction} | {', '.join(map(str, budgets))} | {mean:.1f} | {n / mean:.2f}x | "
            f"{search_ppl} | {math.exp(test_loss):.3f} |"
        )
    print()
    for name, info in result["summary"].items():
        extra = f", train L_mem {info['l_mem']:.4f}" if info["l_mem"] is not None else ""
        searched = result["searches"].get(name)
        search = f"; budget search {searched[0]} evaluations in {searched[1]:.0f} s" if searched else ""
        print(
            f"- {name}: train LM loss {info['train_loss']:.3f} (mean of the last 20 steps){extra}, "
            f"{info['ms_per_step']:.0f} ms/step{search}"
        )
    print(flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 256], help="paper: 512 1024 2048")
    parser.add_argument("--hidden", type=int, default=128, help="d_model (paper d=8: 512)")
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--heads", type=int, default=4, help="query and KV heads (head_dim = hidden / heads)")
    parser.add_argument("--vocab", type=int, default=1024, help="BPE vocabulary trained on the train files")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--eps", type=float, default=0.1, help="L_mem weight (paper: 0.1)")
    parser.add_argument("--tau", type=float, default=1.0, help="L_mem clamp (paper: 1)")
    parser.add_argument(
        "--budget-step", type=int, default=8, help="C, tokens per budget reduction (paper: 8)"
    )
    parser.add_argument(
        "--ppl-tolerance",
        type=float,
        default=0.0,
        help="search target = baseline search ppl x (1 + this); 0 is the paper's rule",
    )
    parser.add_argument("--search-seqs", type=int, default=16)
    parser.add_argument("--test-seqs", type=int, default=32)
    parser.add_argument("--eval-batch", type=int, default=32)
    parser.add_argument("--max-files", type=int, default=None, help="use only the first N files (smoke runs)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="1: on 2 shared cores, 2 threads ran up to 10x slower per step"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("RAYON_NUM_THREADS", str(args.threads))  # the tokenizer's thread pool

    start = time.perf_counter()
    corpus = load_corpus(args)
    tokens = {split: len(stream) for split, stream in corpus["streams"].items()}
    probe = build_models(args, corpus["vocab"], max(args.contexts))["baseline"]
    params = sum(p.numel() for p in probe.parameters())
    print(
        f"KV memory at baseline perplexity: Python {platform.python_version()} standard library "
        f"({corpus['root']}, *.py, site-packages excluded; files train/search/test "
        f"{corpus['files']['train']}/{corpus['files']['search']}/{corpus['files']['test']}, tokens "
        f"{tokens['train']}/{tokens['search']}/{tokens['test']}), byte-level BPE vocab {corpus['vocab']} "
        f"trained on the train files ({corpus['chars']['train'] / tokens['train']:.2f} chars/token). "
        f"Qwen3 d_model {args.hidden}, {args.layers} layers, {args.heads} heads of {args.hidden // args.heads} "
        f"({params / 1e6:.2f}M parameters, tied embeddings); {args.steps} steps, batch {args.batch}, AdamW lr "
        f"{args.lr} (warm-up {args.warmup}, cosine to 10%), L_mem eps {args.eps} tau {args.tau}, seed "
        f"{args.seed}; budget search C={args.budget_step} on {args.search_seqs} search sequences, test on "
        f"{args.test_seqs}. torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.machine()} ({os.cpu_count()} CPUs)",
        flush=True,
    )
    for n in args.contexts:
        print_table(n, run_context(n, corpus, args), args)
    print(f"wall time: {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
