"""A timing model of paravt's rollout schedules at the paper's scale, on a virtual clock.

`params` holds every time and shape parameter with its source, `workload` draws the paper's
long-tailed trajectories, `clock` is the event loop with the engine and trainer stand-ins, and
`modes` drives paravt's own scheduling decisions (the staleness gate, the turn-boundary weight
loads, the server router, the rank shares) with them. `benchmarks/scale_model.py` prints the
table; `benchmarks/scale_calibrate.py` ties the model to runs measured on this machine.
"""
