"""rl.distributed.TrainerRanks across two real processes (gloo). Each rank writes what it saw to OUT/RANK.json.

python -m torch.distributed.run --standalone --nproc-per-node 2 -m tests.rl.ranks_job OUT
"""

import json
import sys
from pathlib import Path

import torch.distributed as dist

from rl.distributed import RankZeroFailed, TrainerRanks

if __name__ == "__main__":
    ranks = TrainerRanks.from_env(wait_timeout_s=60)
    seen = {"rank": ranks.rank, "world": ranks.world}
    seen["shared"] = ranks.share({"from": ranks.rank})
    seen["value"] = ranks.on_main(lambda: "built")
    try:
        ranks.on_main(lambda: 1 / 0)
    except RankZeroFailed as err:
        seen["failure"] = f"RankZeroFailed: {err}"
    except ZeroDivisionError:
        seen["failure"] = "ZeroDivisionError"
    seen["any"] = [ranks.any(ranks.rank == 1), ranks.any(False)]
    Path(sys.argv[1], f"{ranks.rank}.json").write_text(json.dumps(seen))
    dist.destroy_process_group()
