"""Evaluation: benchmark adapters (`paravt.eval.adapters`), scoring, and the runner."""
