"""arithmech.interp."""
