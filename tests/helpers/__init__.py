"""What several test tiers (and the benchmark scripts) share, importable as ``tests.helpers``.

``world`` runs a script as a small local world through the real launcher; ``gpt`` is the
benchmark GPT; ``tiny`` holds the small parity models, data and single-process references;
``figures`` says what a test may check of a measured speed (that it is a number, never how big).
pytest puts the repository root on ``sys.path`` (setup.cfg) and ``world`` puts it first on the
ranks' ``PYTHONPATH``, so neither tests nor their worker scripts edit ``sys.path``.
"""
