"""The recipe's schema, one module per part: ``train`` (the recipe: ``TrainConfig``, loading,
``--set`` overrides, the agent -> worker-group plan), ``rollout`` (the ``rollout:`` and ``data:``
sections), ``val`` (``val:``), ``forecast`` (the ``plan:`` section that ``train --plan`` reads)."""
