"""2-rank CPU (gloo) tests of the FSDP2 paths; `launch` starts `worker.py` on each rank."""
