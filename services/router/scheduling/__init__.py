"""The router's scheduling framework: filters (hard constraints) → scorers (weighted signals,
each 0..1) → picker (ranked list), composed from YAML profiles."""
