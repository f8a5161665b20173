"""The plan's one error type."""


class PlanError(ValueError):
    """A configuration, model or dry run the plan cannot read; the message names it."""
