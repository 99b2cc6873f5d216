"""The store's schema versions, in order (each names its down_revision)."""
