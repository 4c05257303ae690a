"""Dashboard views, one module per page."""
