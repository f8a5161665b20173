"""arithmech.tools."""
