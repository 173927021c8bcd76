"""The event log's vocabulary: the event records and their declarations, the catalogue and upcasters, the answer sources, and the pure fold into job state."""
