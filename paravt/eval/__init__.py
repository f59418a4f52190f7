"""Evaluation: benchmark adapters (`paravt.eval.benchmarks`), scoring, and the runner."""
