"""Training Selective Attention models: the memory loss and the loss under KV budgets
(:mod:`~rl.selective.losses`), the per-layer budget search (:mod:`~rl.selective.budgets`), and the base's
selection kept through SFT (:mod:`~rl.selective.frozen_selection`)."""
