"""Filters: hard constraints. A worker a filter rejects cannot serve the request, whatever its
scores; each rejection names the filter and the reason, for explanations."""
