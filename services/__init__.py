"""Meridian's services: edge, router, worker, and the code they share (common)."""
