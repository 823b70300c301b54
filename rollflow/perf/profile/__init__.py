"""`rollflow profile`: measure a model's operators on the present device and write Vidur-format tables.

The simulator reads the tables by path, as it reads Vidur's published ones (`rollflow/perf/tables.py`).
"""
