"""Mid-stream migration: a stream whose worker breaks after the first token continues on
another worker, the client's stream unbroken.

- ``policy.py``   — :class:`MigrationPolicy`, the bounds (attempts, resumable length, time
  without tokens, stall threshold), validated when the edge is configured;
- ``refusal.py``  — :func:`migration_refusal`, the one predicate saying which requests cannot
  be carried faithfully to another worker (and why);
- ``resume.py``   — :class:`Delivered`, what the client has received, and the resume state a
  continuing worker gets (``GenerateRequest.resume``);
- ``triggers.py`` — what broke: a mid-stream error or a handed-back chunk → a named trigger;
- ``driver.py``   — :class:`MigratingStream`, the chunk iterator the stream stage reads: it
  hides migrations from the stage except for the count it reports to the client.
"""
