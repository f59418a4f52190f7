"""Data parallelism: rank bookkeeping and collectives (pure), FSDP2 sharding and checkpoints."""
