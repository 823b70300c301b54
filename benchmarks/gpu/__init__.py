"""The GPU benchmark (`make bench-gpu`): run.py and its stages."""
