"""`heed train` and `heed launch` whose GRPO rollouts start every even slot with the example's gold DA trace
(tests/rl/grpo_job.py's ``GoldForcedRollout``): a tiny model that has not learnt the protocol yet still
gets groups with a reward spread, so a few GRPO steps have a non-zero loss and gradient to compare.
Everything else is the real recipe. Runs as one process, under torchrun, or as a Ray job:

    python -m tests.rl.gold_forced_train train OVERRIDES...
    python -m torch.distributed.run --standalone --nproc-per-node 2 -m tests.rl.gold_forced_train train ...
    python -m tests.rl.gold_forced_train launch --address http://HEAD:8265 OVERRIDES...

`launch` is the product's client with one change: the job's entrypoint is this module's ``driver`` in
place of ``python -m rl.launch``. The driver is the product's too, except that it hands Ray Train
:func:`train_worker`, which forces gold in the trainer rank and then runs ``rl.launch.train_worker``. The
job's package is the source tree, tests included, so every rank imports this module by name.
"""

import shlex
import sys

from rl import launch

# The data and evals of the shrunk tiny job the gold-forced runs train (test_multiprocess.py,
# ray_cluster.py): 16 training rows, two held-out ones, one greedy `da` eval after GRPO
SMALL_DATA_AND_EVAL = [
    "data.build.splits={train: 16, test: 2}",
    "data.build.lengths=[256]",
    "data.eval_examples=2",
    "eval.modes=[da]",
    "eval.max_tokens=24",
    "eval.before_training=false",
    "eval.sampled_samples=0",
    "logging.wandb_mode=disabled",
]

MODULE = "tests.rl.gold_forced_train"
# the product's, bound before main() replaces them
recipe_worker, product_entrypoint = launch.train_worker, launch.entrypoint


def force_gold() -> None:
    """Make ``rl.grpo.DARollout`` gold-forced in this process (what ``rl.run_grpo.grpo_trainer`` builds)."""
    import rl.grpo
    from tests.rl.grpo_job import GoldForcedRollout

    if not issubclass(rl.grpo.DARollout, GoldForcedRollout):
        rl.grpo.DARollout = type("GoldForcedDARollout", (GoldForcedRollout, rl.grpo.DARollout), {})


def train_worker(loop_config: dict) -> None:
    """One trainer rank of a `launch` job: ``rl.launch.train_worker`` with gold-forced rollouts."""
    force_gold()
    recipe_worker(loop_config)


def driver_entrypoint(raw: dict, *, resume: bool, python: str) -> str:
    """``rl.launch.entrypoint`` with this module's driver in place of ``python -m rl.launch``."""
    python, flag, module, *args = shlex.split(product_entrypoint(raw, resume=resume, python=python))
    assert (flag, module) == ("-m", "rl.launch"), "rl.launch.entrypoint changed its shape"
    return shlex.join([python, "-m", MODULE, "driver", *args])


def main(argv: list[str]) -> int:
    from rl.cli import main as heed

    command, args = argv[0], argv[1:]
    if command == "driver":  # the job's entrypoint, on the cluster
        from tests.rl import gold_forced_train  # by its name: Ray pickles the worker function by reference

        launch.train_worker = gold_forced_train.train_worker
        return launch.driver_main(args)
    if command == "launch":
        launch.entrypoint = driver_entrypoint
    else:
        force_gold()
    return heed(argv)


if __name__ == "__main__":  # ends as the `heed` console script does (rl.cli.run)
    from rl.distributed import exit_process

    exit_process(main(sys.argv[1:]))
