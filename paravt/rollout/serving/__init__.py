"""Rollout servers: `paravt serve-rollout`, its wire format, the trainer's client and launcher."""
