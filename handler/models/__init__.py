"""The model lifecycle: loader, registry, reload (admin, sources, watcher), S3 fetch and cache."""
