"""The engine profiler: a client of running engines that measures their iterations from the
token streams (`rollflow profile engine`) and replays traces against them, writing the tables
`rollflow sim` reads. It sits beside the engines it drives; perf/ only reads what it writes."""
