"""arithmech: find, explain and precisely fine-tune the parts of a language model that do arithmetic.

Implements Zhang et al., "Interpreting and Improving Large Language Models in Arithmetic Calculation"
(ICML 2024, arXiv 2409.01659) on plain Hugging Face models with hooks on their real modules.

io, jobs, code_digest are the base: atomic writers and provenance, the rule-script job wrapper, code digests.
config checks a configuration (schema and cross-references) before any job.
model, intervention, data, interp, sft, report are the library; each __init__ names its public API.
stages holds the rule entry points, one module per workflow/rules/*.smk; tools the repository's tools (make docs,
make plan, make rehearsal).
Imports go stages/tools -> config -> library -> base, never back (pyproject.toml [tool.importlinter],
tests/project/test_architecture.py).
"""

__version__ = "0.1.0"
