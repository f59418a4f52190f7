"""Lightning objects: GRPOModule, SFTModule, the rollout-generating DataModule, checkpoint I/O."""
