"""arithmech.sft."""
