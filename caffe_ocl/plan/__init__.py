"""The planning stage between Net and the launches (filled in next)."""
