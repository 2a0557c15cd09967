"""`heed train` whose GRPO rollouts start every even slot with the example's gold DA trace
(tests/rl/grpo_job.py's ``GoldForcedRollout``): a tiny model that has not learnt the protocol yet still
gets groups with a reward spread, so a few GRPO steps have a non-zero loss and gradient to compare.
Everything else is the real recipe. Runs as one process or under torchrun:

    python -m tests.rl.gold_forced_train train OVERRIDES...
    python -m torch.distributed.run --standalone --nproc-per-node 2 -m tests.rl.gold_forced_train train ...
"""

import sys

if __name__ == "__main__":
    import rl.grpo
    from rl.cli import main
    from tests.rl.grpo_job import GoldForcedRollout

    rl.grpo.DARollout = type("GoldForcedDARollout", (GoldForcedRollout, rl.grpo.DARollout), {})
    sys.exit(main(sys.argv[1:]))
