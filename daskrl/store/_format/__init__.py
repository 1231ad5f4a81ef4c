"""The bytes of a batch: the only way in to them (private)."""
