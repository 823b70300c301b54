"""Capacity planning over the simulators: the serving search (`rollflow sim search`)."""
