"""The manager's core: the engine fleet and its registry, the batches and their samples, the
queue and the router's dispatch, each attempt's stream reduced into its sample, and packing
into micro-batches. No HTTP here (see `edge`)."""
