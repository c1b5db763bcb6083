"""The SWE domain: repository-level bug fixing, as tasks, a grader and a tool environment.

Parts, bottom up (each module's docstring says more):

- ``templates``, ``mutations``, ``generator``: seeded small repositories with one catalogued bug,
  an issue written from the failing behaviour, FAIL_TO_PASS/PASS_TO_PASS, levels 1-3, splits
  disjoint by bug, and the leak channel (a share ``leak_share`` of train repositories whose history
  holds the fix commit);
- ``loader``: SWE-bench-format JSONL over git clones already on disk (nothing is downloaded);
- ``patching``: unified diffs over in-memory copies; protected test paths;
- ``runner``: a repository's tests in the code domain's sandbox;
- ``domain``: ``SWEDomain`` (registered as ``swe``), grading a patch in a clean copy;
- ``environment``: the tools of an episode (``git_log`` is the leak channel, counted);
- ``episode``: multi-turn episodes over any ``generate(messages) -> text`` policy.

It imports only the domains part (``task``, ``base`` and the code domain's executor).
"""
