"""API plumbing shared by every app's REST views: authentication, permissions, parsers,
renderers and pagination."""
