"""The `burnrate` command: one entry point for every part."""
