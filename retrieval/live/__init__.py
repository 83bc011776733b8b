"""The live index: the durable document store, the segmented write buffer, views over a snapshot plus the buffer,
background rebuilds and the atomic swap."""
