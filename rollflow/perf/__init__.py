"""Execution-time models: how long one batch iteration takes on one replica."""
