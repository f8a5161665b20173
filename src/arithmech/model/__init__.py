"""arithmech.model."""
