"""arithmech.data."""
