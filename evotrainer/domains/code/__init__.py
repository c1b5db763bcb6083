"""The code domain: function tasks (generated, HumanEval) and stdin/stdout problems (APPS, TACO,
CodeContests, LiveCodeBench files), graded by a sandboxed executor with visible and hidden tests."""
