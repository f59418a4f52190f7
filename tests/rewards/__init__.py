"""Tests of paravt.rewards."""
