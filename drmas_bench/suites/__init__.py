"""The suites, one folder each: ``math/``, ``search/``, ``toy/``. A suite folder holds everything
of its kind of task: its ``Suite`` and benchmarks (``benchmarks.py``), its grading family
(``grading.py``), its agents' format rules (``rules.py``), its workflows (one module each, with
their packaged ``<workflow>.prompts.yaml`` beside them) and the words its figures are shown with
(the rules' and workflows' ``labels``). Its ``__init__`` imports those modules, which register
themselves; ``discovery`` imports every folder here (and the modules in ``$DRMAS_SUITES``),
so adding a suite or a workflow edits nothing outside its folder (docs/architecture.md). Beside the
folders, three modules that are no suite: ``registry`` (``Suite``, ``SUITES``, ``get_suite``),
``discovery`` (finding the suites) and ``arithmetic`` (what the toy and math suites' warm starts share)."""
