"""Measured GPU metrics: collection from dcgm-exporter or Prometheus, storage, per-job measures,
hotspots, the simulated exporter and the metrics API."""
