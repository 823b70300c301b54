"""What outlives a manager: its journal (SQLite, one manager per file), recovery from it on a
restart, stop strings that span a resume, and the opt-in request log."""
