"""LoRA adapters served in mixed batches (Punica / S-LoRA): PEFT checkpoints read and checked
against the base model (adapter.py), the `--lora-modules` forms (modules.py), device slots and the
host LRU with loading off the engine thread (manager.py), and the per-layer stacks the projections
add their low-rank delta from (weights.py)."""
