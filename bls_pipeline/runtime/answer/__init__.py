"""The flow's answer, row by row, made into each request's outputs: top-k labels, ROUTE, the
flow's own outputs, regions, and the JSON document."""
