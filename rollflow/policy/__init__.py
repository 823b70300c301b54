"""Pure scheduling decisions shared by the simulator, the learning environment and the live manager.

A policy reads a frozen snapshot of the cluster and returns a decision; it never does I/O and
never reads a clock of its own (time arrives in the snapshot).
"""
