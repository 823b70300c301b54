"""Reading engines' token streams outside the manager's process: stream processes
(`processes: N`), relays on the engines' nodes (`rollflow manager relay`), and the wire
between them and the manager."""
