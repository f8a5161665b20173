"""arithmech.report."""
