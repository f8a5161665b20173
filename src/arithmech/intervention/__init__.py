"""arithmech.intervention."""
