"""The bottom layer: errors, types, configuration, the manifest, the CPU budget; imports nothing else in handler."""
