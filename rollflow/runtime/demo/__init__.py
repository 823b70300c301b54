"""`rollflow demo`: RL training that keeps going while a spot engine is preempted."""
