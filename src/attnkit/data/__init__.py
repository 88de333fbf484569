"""Data: prepared dataset folders, batching and collation."""
