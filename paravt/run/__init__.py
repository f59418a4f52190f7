"""Run assembly: config -> Trainer and modules, cold start, reports, curves, `paravt rollout`."""
