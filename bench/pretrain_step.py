"""What Selective Attention costs `heed pretrain`: seconds per optimizer step of a standard base and of a
Selective Attention base (L_mem added), at the recipe's two shapes, side by side in one process.

    .venv/bin/python -m bench.pretrain_step [--config configs/base/tiny-base.yaml] [--steps 4] [OVERRIDE ...]

Each case builds the recipe's model fresh (``rl.pretrain.Pretraining``, nothing written but a scratch run
directory), takes one step to warm up, then times ``--steps`` steps: the recall warm-up's rows
(``recall_warmup.batch_size`` x ``recall_warmup.seq_len``) and the corpus's (``batch_size`` x ``seq_len``,
with the replayed tables when ``recall_warmup.replay`` is set). The ratio says how much longer the recipe
runs as a Selective Attention base: the dense selection builds ``[b, n, n]`` tensors per layer, which cost
little at 128 tokens and much at 1,024.
"""

from __future__ import annotations

import argparse
import tempfile
import time


def step_seconds(config_path: str, overrides: list[str], selective: bool, warmup: bool, steps: int) -> float:
    """Mean seconds of ``steps`` optimizer steps of a fresh run, after one untimed step."""
    from rl.pretrain import Pretraining, load_pretrain_config

    with tempfile.TemporaryDirectory() as scratch:
        phase = ["recall_warmup.steps=1000", "max_steps=2000"] if warmup else ["recall_warmup.steps=0"]
        where = [f"run_dir={scratch}", f"out={scratch}/base", f"selective.enabled={selective}"]
        cfg = load_pretrain_config(config_path, [*overrides, *where, *phase])
        run = Pretraining(cfg)
        run.setup(resume=False)
        run.train_step()
        started = time.perf_counter()
        for _ in range(steps):
            run.train_step()
        return (time.perf_counter() - started) / steps


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/base/tiny-base.yaml")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per case")
    parser.add_argument("overrides", nargs="*", help="pretrain config overrides, key=value")
    args = parser.parse_args(argv)
    print(f"{'rows':<10} {'standard s/step':>16} {'selective s/step':>17} {'ratio':>6}")
    for name, warmup in (("warm-up", True), ("corpus", False)):
        standard, selective = (
            step_seconds(args.config, args.overrides, sa, warmup, args.steps) for sa in (False, True)
        )
        print(f"{name:<10} {standard:>16.3f} {selective:>17.3f} {selective / standard:>5.2f}x", flush=True)


if __name__ == "__main__":
    main()
