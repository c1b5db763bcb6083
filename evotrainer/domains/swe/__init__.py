"""The SWE domain: repository-level bug fixing (generated repositories or SWE-bench-format instances)."""
