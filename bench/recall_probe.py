"""Does a small decoder learn associative recall, and how fast? The skill Heed's base model must have before a
needle in a long context can teach it anything, measured on the purest data for it.

    .venv/bin/python -m bench.recall_probe [--keys magic|near|word] [--adjacent | --sentences] [--first N] [--steps 3500]
    .venv/bin/python -m bench.recall_probe --checkpoint runs/pretrain/checkpoint.pt   # a pretraining run's rates
    .venv/bin/python -m bench.recall_probe --chunks --keys near --sentences --init models/heed-tiny-base \
        --lr 3e-4 --save /tmp/base_chunks                                       # key-to-chunk, from the base

It trains a Qwen3-architecture model of the tiny default's shape (``rl.model``, the shipped tokenizer) on
terse lookup tables only: 2-4 facts ``" silver-owl: 63."`` (``--keys magic``: the tasks' hyphenated keys,
three to five tokens each; ``--keys near``: the same, every key after the first sharing its adjective or
noun, ``silver-owl`` beside ``silver-fox``, as multikey's look-alike needles do; ``--keys word``:
single-token words), then the same keys asked again in any order. Variants:

- ``--adjacent``: ``" silver-owl 63."``, the value right after its key, as an induction head matches;
- ``--sentences``: each fact the tasks' needle, ``" One of the special magic numbers for silver-owl is:
  63."``, asked as ``" silver-owl is: 63."``, words between the key and its value as a ``keyed`` focus
  reads it;
- ``--chunks``: each fact under a chunk header, ``"Magic Chunk 7: silver-owl: 63."``, and what is asked is
  the key's chunk, ``" silver-owl is in Magic Chunk 7."``: the binding a focus tag needs to name the one
  chunk that holds the asked key among look-alikes (the number sits before the key, not after it);
- ``--first N``: adjacent single-token tables for the first N steps whatever the other flags say, a
  curriculum.

``--batch`` rows of 128 tokens a step, AdamW at ``--lr`` after 100 warm-up steps, from random weights or,
with ``--init``, a base folder's (``--save`` writes the result as a copy of that folder, which ``heed train
model.path=`` loads). Every ``--every`` steps it prints, over 60 fixed held-out tables of 2-4 and of 5-8
keys, two teacher-forced rates at the answer token:

- ``acc``: the argmax is the asked key's value (recall; with ``--chunks`` its chunk's number);
- ``copy``: the argmax is one of the table's values (any of them; with ``--chunks`` its chunk numbers).

With ``--keys near`` ``acc`` is also split by the word the asked key shares with another key of its table
(``adjective twin``, ``noun twin``, ``both``: bench/look_alikes.py); for values the noun twin is the harder one.

``copy`` near 1 with ``acc`` near ``1 / keys`` (0.36 for 2-4 keys, 0.15 for 5-8) is a model that has learned
to copy a value but not to bind it to its key; recall is ``acc`` near ``copy``. What is left out: the
corpus's other documents, longer rows and any schedule but warm-up (``heed pretrain`` has them).
"""

from __future__ import annotations

import argparse
import random
import re
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", choices=("magic", "near", "word"), default="magic")
    ap.add_argument("--adjacent", action="store_true", help="no ':' between a key and its value")
    ap.add_argument("--sentences", action="store_true", help="facts as the tasks' needles (magic keys only)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3500)
    ap.add_argument("--first", type=int, default=0, help="steps of adjacent single-token tables first")
    ap.add_argument("--every", type=int, default=500)
    ap.add_argument(
        "--chunks", action="store_true",
        help="ask each key's chunk, not its value: facts under `Magic Chunk N:` headers (magic keys only)",
    )  # fmt: skip
    ap.add_argument("--init", help="train on from a base folder's weights and shape, not from random weights")
    ap.add_argument("--save", help="with --init: write the trained model as a copy of that base folder here")
    ap.add_argument("--checkpoint", help="no training: the rates of a `heed pretrain` RUN_DIR/checkpoint.pt")
    ap.add_argument(
        "--selective", action="store_true", help="a Selective Attention model (selective.enabled)"
    )
    args = ap.parse_args()
    if args.sentences and (args.adjacent or args.keys == "word"):
        ap.error(
            "--sentences writes the tasks' needles: use it with --keys magic or near, without --adjacent"
        )
    if args.init and (args.hidden, args.layers) != (ap.get_default("hidden"), ap.get_default("layers")):
        ap.error("--init trains the base folder's shape: drop --hidden and --layers")
    if args.save and not args.init:
        ap.error("--save writes a copy of the --init base folder: give --init")
    if args.save and Path(args.save).exists():  # checked now, not after the training
        ap.error(f"--save {args.save} exists: name a new folder")
    if args.chunks and (args.adjacent or args.keys == "word" or args.first):
        ap.error(
            "--chunks asks for the tasks' keys: use it with --keys magic or near, without --adjacent or --first"
        )

    import torch

    from bench.look_alikes import twin
    from data.phrasings import needle, restated
    from data.tasks.names import magic_keys
    from data.tokenizer import build_tokenizer
    from rl.model import TinyModelConfig, build_tiny_model

    torch.manual_seed(0)
    tok = build_tokenizer()
    h = args.hidden
    shape = TinyModelConfig(
        hidden_size=h, num_hidden_layers=args.layers, num_attention_heads=h // 32,
        num_key_value_heads=max(1, h // 64), head_dim=32, intermediate_size=4 * h,
    )  # fmt: skip
    if args.init:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(args.init, dtype=torch.float32)
    else:
        model = build_tiny_model(tok, shape)
    if args.selective:  # as `heed pretrain` switches the model it builds
        from rollouts.selective.attention import SELECTIVE, register_selective_attention

        register_selective_attention()
        model.set_attn_implementation(SELECTIVE)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    sep = tok.convert_tokens_to_ids("<|endoftext|>")
    words = sorted({t[1:] for t in tok.get_vocab() if t.startswith("Ġ") and t[1:].isalpha() and len(t) > 3})

    def table(rng: random.Random, low: int, high: int, easy: bool = False) -> tuple[str, dict[str, str]]:
        """A table and each key's value; ``easy``: adjacent single-token keys, whatever the flags say."""
        n = rng.randint(low, high)
        if args.keys == "word" or easy:
            keys = rng.sample(words, n)
        else:  # "near": every key after the first shares a word with it, as multikey's look-alikes do
            keys = magic_keys(rng, n, near=n - 1 if args.keys == "near" else 0)
        value = dict(zip(keys, map(str, rng.sample(range(10, 100), n)), strict=True))
        if args.chunks:  # the "value" asked is the number of the chunk whose header the fact sits under
            chunk = dict(zip(keys, map(str, rng.sample(range(1, 13), n)), strict=True))
            fact = {
                k: needle(rng, "ruler", k, value[k]) if args.sentences else f"{k}: {value[k]}." for k in keys
            }
            facts = "".join(f"Magic Chunk {chunk[k]}: {fact[k]}\n" for k in keys)
            asked = "\n".join(f" {k} is in Magic Chunk {chunk[k]}." for k in rng.choices(keys, k=n))
            return f"{facts}\n{asked}\n", chunk
        if args.sentences and not easy:
            fact = {k: needle(rng, "ruler", k, value[k]) for k in keys}
            asked = "\n".join(f" {restated(fact[k], k, value[k])}." for k in rng.choices(keys, k=n))
            return "".join(f" {fact[k]}" for k in keys) + f"\n\n{asked}\n", value
        sep = " " if args.adjacent or easy else ": "
        facts = "".join(f" {k}{sep}{value[k]}." for k in keys)
        asked = "\n".join(f" {k}{sep}{value[k]}." for k in rng.choices(keys, k=n))
        return f"{facts}\n\n{asked}\n", value

    def batch(rng: random.Random, easy: bool, seq_len: int = 128) -> torch.Tensor:
        rows = []
        for _ in range(args.batch):
            row: list[int] = []
            while len(row) < seq_len:
                row += tok(table(rng, 2, 4, easy)[0], add_special_tokens=False)["input_ids"] + [sep]
            rows.append(row[:seq_len])
        return torch.tensor(rows)

    @torch.no_grad()
    def rates(low: int, high: int) -> str:
        rng, right, copied, total = random.Random(123), 0, 0, 0
        by_twin: dict[str, list[int]] = {}  # --keys near: [right, total] by the word the asked key shares
        for _ in range(60):
            text, value = table(rng, low, high)
            keys, values = list(value), list(value.values())
            enc = tok(text, return_offsets_mapping=True, add_special_tokens=False)
            ids = torch.tensor([enc["input_ids"]])
            pred = model(ids).logits[0].argmax(-1)
            value_ids = {tok.convert_tokens_to_ids("Ġ" + v) for v in values}
            body = text.index("\n\n")
            for m in re.finditer(r" (\d+)\.", text[body:]):  # numbers are values only
                start = body + m.start(1) - 1  # the value's token starts at its space
                j = next(k for k, (a, b) in enumerate(enc["offset_mapping"]) if a <= start < b)
                total += 1
                hit = int(pred[j - 1] == ids[0, j])
                right += hit
                copied += int(int(pred[j - 1]) in value_ids)
                if args.keys == "near":
                    key = keys[values.index(m.group(1))]
                    cell = by_twin.setdefault(twin(key, [k for k in keys if k != key]), [0, 0])
                    cell[0] += hit
                    cell[1] += 1
        split = "".join(f", {t} twin {r / n:.2f} (n={n})" for t, (r, n) in sorted(by_twin.items()))
        return f"acc {right / total:.2f} copy {copied / total:.2f}{split}"

    if args.checkpoint:  # a pretraining run of this shape (configs/base/tiny-base.yaml's)
        state = torch.load(args.checkpoint, weights_only=True)
        model.load_state_dict(state["model"])
        model.eval()
        print(f"{args.checkpoint} (step {state['step']}) | 2-4 keys: {rates(2, 4)} | 5-8 keys: {rates(5, 8)}")
        return
    params = sum(p.numel() for p in model.parameters())
    print(
        f"recall probe: {args.keys} keys{', adjacent' if args.adjacent else ''}, {params / 1e6:.2f}M parameters, {args.batch} x 128 tokens a step"
    )
    if args.init:
        model.eval()
        print(f"step     0 (the base) | 2-4 keys: {rates(2, 4)} | 5-8 keys: {rates(5, 8)}", flush=True)
        model.train()
    rng, started = random.Random(0), time.perf_counter()
    for step in range(1, args.steps + 1):
        for group in opt.param_groups:
            group["lr"] = args.lr * min(1.0, step / 100)
        x = batch(rng, easy=step <= args.first)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.every == 0:
            model.eval()
            print(
                f"step {step:5d} loss {loss.item():.3f} | 2-4 keys: {rates(2, 4)} | 5-8 keys: {rates(5, 8)} "
                f"| {time.perf_counter() - started:.0f} s",
                flush=True,
            )
            model.train()
    if args.save:  # a base folder `heed train model.path=` loads: the --init folder, these weights
        import shutil

        shutil.copytree(args.init, args.save)
        model.save_pretrained(args.save)


if __name__ == "__main__":
    main()
