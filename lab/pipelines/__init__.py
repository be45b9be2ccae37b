"""The four pipelines, registered by name."""
