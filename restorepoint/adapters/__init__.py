"""Adapters: drive real trainers to produce and consume restore points."""
