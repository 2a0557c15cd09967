"""A few SFT steps under DeepSpeed ZeRO on CPU, in its own process (DeepSpeed initializes
torch.distributed, which must not leak into the test session). Prints the losses as JSON."""

import json
import os
import sys

from data.tokenizer import build_tokenizer
from rl.model import TinyModelConfig, build_tiny_model
from rl.sft import SFTConfig, train_sft
from tests.rl.jobs import end_job
from tests.rl.test_sft import acme_rows

TINY = TinyModelConfig(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=128
)

if __name__ == "__main__":
    deepspeed = sys.argv[1] if sys.argv[1] != "none" else None
    if deepspeed:  # a single-rank "cluster" on loopback; gloo on CPU
        os.environ.update(
            RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2]
        )
    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, TINY)
    config = SFTConfig(
        output_dir=sys.argv[3],
        max_steps=3,
        per_device_batch_size=2,
        warmup_steps=1,
        logging_steps=1,
        deepspeed=deepspeed,
    )
    trainer = train_sft(model, tokenizer, acme_rows(4), config)
    print("LOSSES " + json.dumps([h["loss"] for h in trainer.state.log_history if "loss" in h]))
    end_job()
